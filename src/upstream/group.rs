//! A compiled server group: what a request needs to pick a server, reach it and account for
//! the outcome.
//!
//! Built with each config snapshot, read without locks. What must outlive a reload is in
//! [`ServerState`], shared by `Arc` between the old and the new group of the same name for each
//! server that stays: its health, its requests in flight and its metric handles. The pools are
//! the group's, one client per worker (created on the worker's first request to the group, and
//! used by that worker only), so a reload starts new pools as nginx's does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use http::uri::{Authority, Scheme};
use http::HeaderValue;

use super::balance;
use super::connect::{ConnectSettings, GroupClient, SentBody};
use super::health::{millis, now_ms, Passive, ServerHealth};
use super::pool::Pool;
use crate::config::upstream::{
    Balance, HealthCheckConfig, Protocol, UpstreamConfig, DEFAULT_CONNECT_TIMEOUT,
};
use crate::config::UpstreamUrl;
use crate::metrics::{RetryCounter, ServerMetrics, ServerSample, UpstreamExposition};

/// What a server keeps across reloads.
#[derive(Debug)]
pub struct ServerState {
    pub health: ServerHealth,
    in_flight: AtomicUsize,
    /// Its attempts by class (`None` for a route's own URL, which exports no server series).
    metrics: Option<ServerMetrics>,
}

impl ServerState {
    fn new(metrics: Option<ServerMetrics>) -> ServerState {
        ServerState {
            health: ServerHealth::default(),
            in_flight: AtomicUsize::new(0),
            metrics,
        }
    }

    pub fn metrics(&self) -> Option<&ServerMetrics> {
        self.metrics.as_ref()
    }
}

/// One server of a group.
#[derive(Debug)]
pub struct Server {
    pub scheme: Scheme,
    pub authority: Authority,
    /// `host:port`, the port explicit (the access log's `upstream`).
    pub addr: Arc<str>,
    /// `Host` sent to it (unless the route preserves the client's).
    pub host: HeaderValue,
    pub state: Arc<ServerState>,
}

/// A worker's round-robin counter, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Counter64(AtomicUsize);

/// A compiled group.
pub struct Group {
    pub name: Arc<str>,
    /// `None` for a route's own `https://` URL (a group of one, not exported).
    pub config: Option<UpstreamConfig>,
    pub servers: Box<[Server]>,
    balance: Balance,
    weights: Box<[u32]>,
    seeds: Box<[u64]>,
    schedule: Box<[u16]>,
    counters: Box<[Counter64]>,
    clients: Box<[OnceLock<GroupClient<SentBody>>]>,
    /// The fast front's idle connections: per worker, one pool per server.
    pools: Box<[OnceLock<Box<[Pool]>>]>,
    pub connect: ConnectSettings,
    pub retries: u32,
    /// 0: passive health is off (configured so, or a group of one, as in nginx).
    max_fails: u32,
    fail_timeout_ms: u64,
    /// `None` for a route's own URL (no series).
    retries_total: Option<RetryCounter>,
    /// Replaced by a reload: its health checker stops.
    retired: AtomicBool,
    checks_started: AtomicBool,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.name)
            .field("servers", &self.servers)
            .finish_non_exhaustive()
    }
}

/// The servers a request already tried (at most 256 servers per group).
#[derive(Debug, Default, Clone, Copy)]
pub struct Tried([u64; 4]);

impl Tried {
    pub fn has(&self, i: usize) -> bool {
        self.0
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }
    pub fn add(&mut self, i: usize) {
        if let Some(w) = self.0.get_mut(i / 64) {
            *w |= 1u64 << (i % 64);
        }
    }
}

/// What a pick found.
pub enum Pick<'g> {
    Server(Attempt<'g>),
    /// Every server not yet tried is out by active health checks.
    NoLive,
}

/// One attempt on one server. Dropped without an outcome (the request was cancelled, or
/// failed for the client's reasons), it gives a trial back so the next request may try.
pub struct Attempt<'g> {
    group: &'g Group,
    pub index: usize,
    trial: bool,
}

impl<'g> Attempt<'g> {
    pub fn server(&self) -> &'g Server {
        &self.group.servers[self.index]
    }

    /// A response head came back.
    pub fn succeeded(mut self) {
        let s = self.server();
        let trial = std::mem::take(&mut self.trial);
        if s.state.health.success(trial) {
            tracing::info!(upstream = &*self.group.name, server = %s.authority, "server back in rotation");
        }
    }

    /// A connect, TLS or timeout failure, or an error before the response head.
    pub fn failed(mut self) {
        let g = self.group;
        let s = self.server();
        let trial = std::mem::take(&mut self.trial);
        if g.max_fails == 0 {
            if trial {
                s.state.health.release_trial();
            }
            return;
        }
        if s.state
            .health
            .failure(g.max_fails, g.fail_timeout_ms, now_ms(), trial)
        {
            tracing::warn!(upstream = &*g.name, server = %s.authority, fail_timeout_ms = g.fail_timeout_ms, "server out of rotation after max_fails failures");
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.trial {
            self.server().state.health.release_trial();
        }
    }
}

/// One request in flight on a server, for `least_requests`; released on drop (held by the
/// response body until it is sent or dropped).
#[derive(Debug)]
pub struct InFlight(Arc<ServerState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the groups of the previous snapshot carry over to the next: each server's state by
/// (group, authority), each group's retry counter by name.
#[derive(Debug, Default)]
pub struct Carried {
    servers: HashMap<(Arc<str>, String), Arc<ServerState>>,
    retries: HashMap<Arc<str>, RetryCounter>,
}

impl Carried {
    pub fn new() -> Carried {
        Carried::default()
    }
}

impl Group {
    /// Compiles a configured group for `workers` workers, reusing the state of servers in
    /// `carried`.
    pub fn build(c: &UpstreamConfig, workers: usize, carried: &Carried) -> Result<Group, String> {
        let name: Arc<str> = Arc::from(c.name.as_str());
        let servers = c
            .servers
            .iter()
            .map(|s| {
                let key = (name.clone(), s.url.authority.as_str().to_owned());
                let state = carried.servers.get(&key).cloned();
                if let (Some(state), None) = (&state, &c.health_check) {
                    // Active checks were removed: their verdict goes with them.
                    state.health.set_active_down(false);
                }
                let state = state
                    .unwrap_or_else(|| Arc::new(ServerState::new(Some(ServerMetrics::default()))));
                server(&s.url, state)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let weights: Vec<u32> = c.servers.iter().map(|s| s.weight).collect();
        let connect = settings(
            c.is_https(),
            &c.tls,
            c.connect_timeout,
            &c.servers[0].url,
            c.protocol,
        )?;
        Ok(Group {
            retries_total: Some(carried.retries.get(&name).cloned().unwrap_or_default()),
            config: Some(c.clone()),
            balance: c.balance,
            max_fails: if servers.len() > 1 { c.max_fails } else { 0 },
            fail_timeout_ms: millis(c.fail_timeout),
            retries: c.retries,
            ..Group::assemble(name, servers, weights, connect, workers)
        })
    }

    /// A route's own URL as a group of one, named `name`: no health, no retries, no metrics
    /// (routes naming the same address share it: `routing::single`).
    pub fn single(name: &str, url: &UpstreamUrl, workers: usize) -> Result<Group, String> {
        let state = Arc::new(ServerState::new(None));
        let servers = vec![server(url, state)?];
        let connect = settings(
            url.scheme == Scheme::HTTPS,
            &crate::config::upstream::UpstreamTls::default(),
            DEFAULT_CONNECT_TIMEOUT,
            url,
            Protocol::Http1,
        )?;
        Ok(Group::assemble(
            Arc::from(name),
            servers,
            vec![1],
            connect,
            workers,
        ))
    }

    fn assemble(
        name: Arc<str>,
        servers: Vec<Server>,
        weights: Vec<u32>,
        connect: ConnectSettings,
        workers: usize,
    ) -> Group {
        let seeds = servers
            .iter()
            .map(|s| balance::hash_name(s.authority.as_str()))
            .collect();
        Group {
            name,
            config: None,
            servers: servers.into(),
            balance: Balance::RoundRobin,
            schedule: balance::smooth_schedule(&weights).into(),
            weights: weights.into(),
            seeds,
            counters: (0..workers.max(1)).map(|_| Counter64::default()).collect(),
            clients: (0..workers.max(1)).map(|_| OnceLock::new()).collect(),
            pools: (0..workers.max(1)).map(|_| OnceLock::new()).collect(),
            connect,
            retries: 0,
            max_fails: 0,
            fail_timeout_ms: 0,
            retries_total: None,
            retired: AtomicBool::new(false),
            checks_started: AtomicBool::new(false),
        }
    }

    /// The active health check settings, if any.
    pub fn health_check(&self) -> Option<&HealthCheckConfig> {
        self.config.as_ref().and_then(|c| c.health_check.as_ref())
    }

    /// This worker's pooled client to the group (created at the worker's first use).
    pub fn client(&self, worker: usize) -> &GroupClient<SentBody> {
        let slot = &self.clients[worker % self.clients.len()];
        slot.get_or_init(|| GroupClient::new(&self.connect))
    }

    /// This worker's pool of idle connections to server `index` (the fast front's).
    pub fn pool(&self, worker: usize, index: usize) -> &Pool {
        let pools = self.pools[worker % self.pools.len()].get_or_init(|| {
            (0..self.servers.len().max(1))
                .map(|_| Pool::default())
                .collect()
        });
        &pools[index % pools.len()]
    }

    /// Whether the balancing needs the client IP (`ip_hash`).
    pub fn hashes_ip(&self) -> bool {
        self.balance == Balance::IpHash
    }

    /// Counts one retry.
    pub fn count_retry(&self) {
        if let Some(c) = &self.retries_total {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Retries so far (0 for a route's own URL).
    pub fn retries(&self) -> u64 {
        self.retries_total
            .as_ref()
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Picks a server for a request that already tried `tried`; `client` is the client IP's
    /// hash for `ip_hash`. Servers out by passive health are skipped while any other is live
    /// (one whose `fail_timeout` has passed gets one trial request); with none live they are
    /// tried anyway (nginx's behaviour). Servers out by active checks are never picked.
    pub fn pick(&self, worker: usize, client: u64, tried: &Tried) -> Pick<'_> {
        let start = match self.balance {
            Balance::IpHash => 0,
            _ => self.counters[worker % self.counters.len()]
                .0
                .fetch_add(1, Ordering::Relaxed),
        };
        let now = std::cell::Cell::new(0u64);
        let clock = || match now.get() {
            0 => {
                let n = now_ms();
                now.set(n);
                n
            }
            n => n,
        };
        let passive = |i: usize| self.servers[i].state.health.passive(clock);
        let mut skip = *tried;
        for _ in 0..self.servers.len() {
            let strict = |i: usize| {
                !skip.has(i)
                    && !self.servers[i].state.health.active_down()
                    && passive(i) != Passive::Out
            };
            let Some(i) = self.select(start, client, strict) else {
                break;
            };
            if passive(i) != Passive::TrialDue {
                return Pick::Server(Attempt {
                    group: self,
                    index: i,
                    trial: false,
                });
            }
            if self.servers[i].state.health.claim_trial() {
                return Pick::Server(Attempt {
                    group: self,
                    index: i,
                    trial: true,
                });
            }
            skip.add(i);
        }
        let relaxed = |i: usize| !tried.has(i) && !self.servers[i].state.health.active_down();
        match self.select(start, client, relaxed) {
            Some(i) => Pick::Server(Attempt {
                group: self,
                index: i,
                trial: false,
            }),
            None => Pick::NoLive,
        }
    }

    fn select(&self, start: usize, client: u64, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        match self.balance {
            Balance::RoundRobin => balance::round_robin(&self.schedule, start, eligible),
            Balance::LeastRequests => balance::least_requests(
                &self.weights,
                |i| self.servers[i].state.in_flight.load(Ordering::Relaxed),
                start,
                eligible,
            ),
            Balance::IpHash => balance::ip_hash(&self.seeds, &self.weights, client, eligible),
        }
    }

    /// Counts a request in flight on server `i` when the group balances by it.
    pub fn in_flight(&self, i: usize) -> Option<InFlight> {
        if self.balance != Balance::LeastRequests {
            return None;
        }
        let state = &self.servers.get(i)?.state;
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(InFlight(state.clone()))
    }

    /// The states of this group's servers and its retry counter, for the next snapshot to
    /// carry over.
    pub fn carry(&self, into: &mut Carried) {
        if self.config.is_some() {
            for s in self.servers.iter() {
                into.servers.insert(
                    (self.name.clone(), s.authority.as_str().to_owned()),
                    s.state.clone(),
                );
            }
            if let Some(r) = &self.retries_total {
                into.retries.insert(self.name.clone(), r.clone());
            }
        }
    }

    /// Replaced by a reload: its checker stops.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Marks the checker started; false if it already was.
    pub fn start_checks_once(&self) -> bool {
        !self.checks_started.swap(true, Ordering::AcqRel)
    }
}

/// Appends the upstream series of `groups` (a snapshot's) to a scrape: every server of every
/// configured group with its health (`tollgate_upstream_server_up`, read now) and attempts,
/// and every group's retries. Only these groups: a server or group no longer configured has no
/// series. A route's own URL has none.
pub fn write_metrics(groups: &[Arc<Group>], out: &mut String) {
    let configured = || groups.iter().filter(|g| g.config.is_some());
    let servers = configured().flat_map(|g| {
        g.servers.iter().filter_map(|s| {
            Some(ServerSample {
                upstream: &g.name,
                server: s.authority.as_str(),
                up: s.state.health.is_up(),
                metrics: s.state.metrics.as_ref()?,
            })
        })
    });
    let retries = configured().map(|g| (&*g.name, g.retries()));
    UpstreamExposition::new(out).write(servers, retries);
}

fn server(url: &UpstreamUrl, state: Arc<ServerState>) -> Result<Server, String> {
    Ok(Server {
        scheme: url.scheme.clone(),
        authority: url.authority.clone(),
        addr: url.host_port(),
        host: HeaderValue::from_str(url.authority.as_str())
            .map_err(|_| format!("{} cannot be a Host header", url.authority))?,
        state,
    })
}

fn settings(
    https: bool,
    tls: &crate::config::upstream::UpstreamTls,
    timeout: std::time::Duration,
    first: &UpstreamUrl,
    protocol: Protocol,
) -> Result<ConnectSettings, String> {
    let tls = if https {
        let config = super::tls::client_config(tls, protocol == Protocol::H2)?;
        let name = match &tls.server_name {
            Some(_) => Some(super::tls::server_name(tls, &first.authority)?),
            None => None,
        };
        Some((config, name))
    } else {
        None
    };
    Ok(ConnectSettings {
        timeout,
        tls,
        protocol,
    })
}
