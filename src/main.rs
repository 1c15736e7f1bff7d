//! The `tollgate` binary: parse the command line, set up logging and metrics, load the config and
//! hand over to the library.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tollgate::{Config, Gateway};

/// A reverse-proxy HTTP gateway with built-in, distributed rate limiting.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    /// The configuration file.
    #[arg(long, short, global = true, default_value = "gateway.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Validate the configuration file and exit: 0 when valid, 1 with the error otherwise.
    Check,
    /// Ask the running gateway's admin listener (`admin.listen` of the config) for `/healthz`:
    /// 0 on a 200 within 2 s, 1 with the reason otherwise. The container image's HEALTHCHECK.
    Health,
    /// Who is being throttled: the running gateway's `/-/top` as a table that refreshes.
    Top {
        /// The admin listener (default: `admin.listen` of the config; 127.0.0.1:9090 without one).
        #[arg(long)]
        admin: Option<SocketAddr>,
        /// Only this route's limits.
        #[arg(long)]
        route: Option<String>,
        /// Print the table once and exit (1 when the gateway cannot be asked).
        #[arg(long)]
        once: bool,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval: u64,
    },
    /// Convert an ingress-nginx or nginx configuration to a `gateway.toml` on stdout; what
    /// could not be converted is reported on stderr with its file and line.
    Import {
        #[command(subcommand)]
        source: ImportSource,
    },
    /// Print the JSON Schema (draft-07) of the configuration file, for editors (taplo / Even
    /// Better TOML: a `#:schema` line) and linters; `consumers`: of the consumers file.
    Schema {
        #[arg(value_enum, default_value_t = SchemaOf::Gateway)]
        of: SchemaOf,
    },
    /// API keys for the consumers file.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// The quick start's demo upstream and client, so the first steps need only this binary.
    Demo {
        #[command(subcommand)]
        command: DemoCommand,
    },
}

#[derive(Debug, Subcommand)]
enum DemoCommand {
    /// A JSON echo server to put behind the gateway (`gateway.toml` forwards to
    /// 127.0.0.1:3000); `GET /slow?ms=N` waits, `GET /status/N` answers N. Stops on SIGTERM or
    /// Ctrl-C.
    Upstream {
        /// Where to listen (`127.0.0.1:0`: a free port, printed).
        #[arg(long, default_value_t = tollgate::demo::upstream::DEFAULT_LISTEN)]
        listen: SocketAddr,
    },
    /// Send requests through the gateway one after the other and print each status with its
    /// rate-limit headers; on a 429, its body, then wait `Retry-After`.
    Client {
        /// The URL to GET (http://).
        #[arg(default_value = tollgate::demo::client::DEFAULT_URL)]
        url: String,
        /// How many requests.
        #[arg(default_value_t = 12)]
        requests: usize,
    },
}

#[derive(Debug, Subcommand)]
enum ImportSource {
    /// Ingress manifests (YAML, several documents per file).
    #[command(name = "ingress-nginx")]
    IngressNginx {
        /// Exit 1 when anything was left out or approximated.
        #[arg(long)]
        strict: bool,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Gateway API HTTPRoute objects and Envoy Gateway BackendTrafficPolicy rate limits
    /// (YAML, several documents per file).
    #[command(name = "gateway-api")]
    GatewayApi {
        /// Exit 1 when anything was left out or approximated.
        #[arg(long)]
        strict: bool,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// An nginx.conf (its `include`s are reported, not followed).
    Nginx {
        /// Exit 1 when anything was left out or approximated.
        #[arg(long)]
        strict: bool,
        file: PathBuf,
    },
}

/// Which file `tollgate schema` describes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SchemaOf {
    /// `gateway.toml`.
    Gateway,
    /// The consumers file (`[consumers] file`).
    Consumers,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Read a key on stdin (one trailing newline ignored) and print its `key_sha256`.
    Hash,
    /// Print a fresh random key, then its `key_sha256`, one per line.
    New,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command.unwrap_or(Command::Run) {
        Command::Check => check(&cli.config),
        Command::Health => health(&cli.config),
        Command::Top {
            admin,
            route,
            once,
            interval,
        } => top(&cli.config, admin, route.as_deref(), once, interval),
        Command::Import { source } => import(source),
        Command::Schema { of } => schema(of),
        Command::Key { command } => key(command),
        Command::Demo { command } => demo(command),
        Command::Run => run(cli.config),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn check(path: &std::path::Path) -> anyhow::Result<()> {
    let loaded = tollgate::runtime::load::load_and_check(path)?;
    let config = &loaded.config;
    for w in config.warnings() {
        eprintln!("tollgate: warning: {w}");
    }
    let shapes: Vec<_> = config
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| tollgate::routing::Shape::of_config(r, i))
        .collect();
    for (never, by) in tollgate::routing::shadowed(&shapes) {
        eprintln!(
            "tollgate: warning: route {never:?} can never match: route {by:?} takes every request it would (see the manual's route precedence)"
        );
    }
    let consumers = match &config.consumers {
        Some(_) => format!(
            ", {} plan(s), {} consumer(s)",
            config.plans.len(),
            loaded.consumers.len()
        ),
        None => String::new(),
    };
    println!(
        "{}: ok ({} route(s), {} limit(s), {} upstream group(s), store {}{consumers})",
        path.display(),
        config.routes.len(),
        config.routes.iter().map(|r| r.limits.len()).sum::<usize>(),
        config.upstreams.len(),
        config.store.backend.as_str()
    );
    Ok(())
}

fn health(path: &std::path::Path) -> anyhow::Result<()> {
    let config = Config::load(path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(tollgate::admin::health::check(
        config.admin.listen,
        std::time::Duration::from_secs(2),
    ))?;
    Ok(())
}

fn top(
    path: &std::path::Path,
    admin: Option<SocketAddr>,
    route: Option<&str>,
    once: bool,
    interval: u64,
) -> anyhow::Result<()> {
    let admin = match admin {
        Some(a) => a,
        None => match Config::load(path) {
            Ok(c) => tollgate::admin::health::probe_addr(c.admin.listen),
            // No config here: the default admin address.
            Err(tollgate::config::ConfigError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                SocketAddr::from(([127, 0, 0, 1], 9090))
            }
            Err(e) => return Err(e.into()),
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(tollgate::top::run(
        admin,
        route,
        once,
        std::time::Duration::from_secs(interval),
    ))?;
    Ok(())
}

fn import(source: ImportSource) -> anyhow::Result<()> {
    let (strict, files, convert): (_, _, fn(_) -> _) = match source {
        ImportSource::IngressNginx { strict, files } => {
            (strict, files, tollgate::import::ingress::convert)
        }
        ImportSource::GatewayApi { strict, files } => {
            (strict, files, tollgate::import::gateway_api::convert)
        }
        ImportSource::Nginx { strict, file } => {
            (strict, vec![file], tollgate::import::nginx::convert)
        }
    };
    let mut inputs = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))?;
        inputs.push((f.display().to_string(), text));
    }
    let import = convert(&inputs)?;
    print!("{}", import.toml);
    for item in &import.report.items {
        eprintln!("{item}");
    }
    let lossy = import.report.lossy();
    if lossy > 0 {
        eprintln!("tollgate import: {lossy} item(s) left out or approximated (listed above)");
    }
    anyhow::ensure!(
        !strict || lossy == 0,
        "--strict: {lossy} item(s) were left out or approximated"
    );
    Ok(())
}

fn demo(command: DemoCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match command {
        DemoCommand::Upstream { listen } => runtime
            .block_on(tollgate::demo::upstream::serve(listen))
            .with_context(|| format!("the demo upstream on {listen}"))?,
        DemoCommand::Client { url, requests } => runtime.block_on(tollgate::demo::client::run(
            &url,
            requests,
            &mut std::io::stdout(),
        ))?,
    }
    Ok(())
}

fn schema(of: SchemaOf) -> anyhow::Result<()> {
    let schema = match of {
        SchemaOf::Gateway => tollgate::config::schema::gateway(),
        SchemaOf::Consumers => tollgate::config::schema::consumers(),
    };
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(())
}

fn key(command: KeyCommand) -> anyhow::Result<()> {
    use tollgate::consumers::{hash_key, new_key};
    use tollgate::hex;
    match command {
        KeyCommand::Hash => {
            let mut input = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut input)
                .context("cannot read the key from stdin")?;
            let key = input.strip_suffix(b"\n").unwrap_or(&input);
            let key = key.strip_suffix(b"\r").unwrap_or(key);
            anyhow::ensure!(!key.is_empty(), "no key on stdin");
            // A key with whitespace at either end can never match: HTTP strips it from a
            // header's value. Refused rather than trimmed, so a pasted key is not silently
            // another one.
            anyhow::ensure!(
                key.trim_ascii() == key,
                "the key on stdin starts or ends with whitespace (HTTP strips it from header values, so it could never match); remove it"
            );
            println!("{}", hex::encode(&hash_key(key)));
        }
        KeyCommand::New => {
            let key = new_key().context("cannot read the system's random source")?;
            println!("{key}");
            println!("{}", hex::encode(&hash_key(key.as_bytes())));
        }
    }
    Ok(())
}

fn run(path: PathBuf) -> anyhow::Result<()> {
    let loaded = tollgate::runtime::load::load_and_check(&path)?;
    // The main runtime runs the admin listener, reload, housekeeping and the Redis store's
    // background tasks; the proxy runs on its own `[server] workers` threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tollgate-main")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let handle = tollgate::metrics::install()
            .map_err(|e| anyhow::anyhow!("cannot install metrics: {e}"))?;
        let gateway = Gateway::bind_boxed(loaded, Some(path), Some(handle)).await?;
        let proxy = gateway.proxy_addr()?;
        let admin = gateway.admin_addr()?;
        let redirect = gateway
            .redirect_addr()
            .map_or(String::new(), |r| format!(" redirect={r}"));
        let rls = gateway
            .rls_addr()
            .map_or(String::new(), |r| format!(" rls={r}"));
        let h3 = gateway
            .h3_addr()
            .map_or(String::new(), |r| format!(" h3={r}"));
        tracing::info!(%proxy, %admin, "tollgate listening");
        // One stable line on stdout for scripts and tests that start on port 0.
        println!("tollgate listening proxy={proxy} admin={admin}{redirect}{rls}{h3}");
        gateway.serve_boxed(Box::pin(shutdown_signal())).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
