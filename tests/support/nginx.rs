//! A private nginx for the tests that hold Tollgate to nginx (`tests/import.rs`,
//! `tests/routing_nginx.rs`): found on `PATH` or in `/usr/sbin`, run on a config in a directory
//! of its own, stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nginx binary (`scripts/test` installs the Debian package), if any.
pub fn nginx_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nginx"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin/nginx")])
        .find(|p| p.is_file())
}

/// A running nginx, stopped on drop.
pub struct Nginx {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs nginx on `conf` in a directory of its own: not a daemon, one process, its temporary
/// files, pid file and logs under that directory (nothing under /var or /run); returns once it
/// listens on `port` of 127.0.0.1.
pub fn start_nginx(bin: &Path, conf: &str, port: u16) -> Nginx {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    // What a packaged nginx would put under /var/lib/nginx: here, under the prefix.
    let conf = conf.replacen(
        "http {",
        "http {\n    access_log off;\n    client_body_temp_path tmp/body;\n    proxy_temp_path tmp/proxy;\n    \
         fastcgi_temp_path tmp/fastcgi;\n    uwsgi_temp_path tmp/uwsgi;\n    scgi_temp_path tmp/scgi;",
        1,
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&path)
        .args(["-e", "stderr"])
        // `crit`: not the "limiting requests" lines of every refusal, but a failed start still.
        .args([
            "-g",
            "daemon off; master_process off; pid nginx.pid; error_log stderr crit;",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx does not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Nginx {
        child,
        port,
        _dir: dir,
    }
}
