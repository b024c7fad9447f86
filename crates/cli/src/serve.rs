//! `cellcache serve`: flags (memcached's short forms beside long ones), logging, signals.

use anyhow::Context;
use cellcache_node::config::{BindingProtocol, IoEngineKind, LogFormat, NodeConfig};

use std::path::PathBuf;

/// Flags override the config file and the environment. Short forms are memcached's.
#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML configuration file (see cellcache.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address(es) to listen on: repeat -l or separate with commas (-l 127.0.0.1,::1), as
    /// memcached; an address twice in one list fails ("Address already in use"), a repeated
    /// -l of listed addresses is ignored, as memcached. A ring member
    /// advertises the first (not 0.0.0.0 unless cluster.advertise_host is set). With -Z,
    /// notls:ADDR is a listener without TLS, as memcached's.
    #[arg(short = 'l', long, value_name = "ADDR[,ADDR...]")]
    pub listen: Vec<String>,
    /// TCP port for memcached clients (0 = any free port).
    #[arg(short = 'p', long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Worker threads. `-t 0` is refused, as
    /// memcached refuses it.
    #[arg(short = 't', long, value_name = "THREADS")]
    pub threads: Option<usize>,
    /// Listen backlog (memcached -b).
    #[arg(short = 'b', long, value_name = "BACKLOG")]
    pub listen_backlog: Option<u32>,
    /// Maximum simultaneous connections.
    #[arg(short = 'c', long, value_name = "MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Memory for items, in megabytes (arena + index, all reserved at start; more than the
    /// machine has available is refused).
    #[arg(short = 'm', long, value_name = "MEGABYTES")]
    pub memory_limit: Option<usize>,
    /// Largest item, as memcached's -I counts it (key + value + 59 bytes, + 4 with client
    /// flags), e.g. 1m, 512k; at least 1024. Raises
    /// the slab size, the input buffer and the inter-cell frame to hold such an item.
    #[arg(short = 'I', long, value_name = "SIZE", value_parser = parse_size)]
    pub max_item_size: Option<usize>,
    /// Allow the `shutdown` command (memcached -A).
    #[arg(short = 'A', long)]
    pub enable_shutdown: bool,
    /// Refuse `flush_all` with "CLIENT_ERROR flush_all not allowed" (memcached -F).
    #[arg(short = 'F', long)]
    pub disable_flush_all: bool,
    /// Answer "SERVER_ERROR out of memory storing object" instead of evicting (memcached -M).
    #[arg(short = 'M', long)]
    pub disable_evictions: bool,
    /// Eviction policy: lru (slab-level LRU) or s3fifo (small, main and ghost FIFOs: keeps
    /// items read again through scans and one-hit wonders; docs/store.md), also
    /// second_chance_fifo or least_live_of_lru.
    #[arg(long, value_name = "POLICY")]
    pub eviction: Option<cellcache_store::EvictionPolicyKind>,
    /// Switch the eviction policy by itself, by the access pattern the cell sees (lru while
    /// evicted items were read, s3fifo when scans push them out; `[switching]`,
    /// docs/switching.md).
    #[arg(long)]
    pub auto_switch: bool,
    /// No CAS (memcached -C): gets/mg report CAS 0, cas and ms C never match, items count
    /// 8 bytes less against -I.
    #[arg(short = 'C', long)]
    pub disable_cas: bool,
    /// Requests a connection may run per turn (memcached -R, > 0): past it, with more
    /// input waiting, the connection yields to the others (`stats`: conn_yields).
    #[arg(short = 'R', long, value_name = "N")]
    pub max_reqs_per_event: Option<u32>,
    /// Prefix delimiter for `stats detail`, and turn the per-prefix counts on (memcached -D).
    #[arg(short = 'D', long, value_name = "CHAR")]
    pub detail_delimiter: Option<char>,
    /// Protocol: auto (by each connection's first byte), ascii or binary (memcached -B).
    #[arg(short = 'B', long, value_name = "PROTOCOL")]
    pub protocol: Option<BindingProtocol>,
    /// File of user:password lines (memcached -Y): clients must log in first — text ones as
    /// memcached -Y (`set <any> 0 0 <n>` with the data "<user> <password>"), binary ones with
    /// SASL PLAIN — and nothing else is served until they do. Every cell of a ring needs it.
    #[arg(short = 'Y', long, value_name = "FILE")]
    pub auth_file: Option<String>,
    /// Serve clients over TLS only (memcached -Z), with -o ssl_chain_cert=PEM,ssl_key=PEM
    /// (server.tls); a client that does not speak TLS is closed.
    #[arg(short = 'Z', long = "enable-ssl")]
    pub enable_ssl: bool,
    /// memcached's extended options, comma-separated, repeatable (-o idle_timeout=10,modern).
    /// Applied: idle_timeout=N (io.idle_timeout_secs); ssl_chain_cert, ssl_key, ssl_ca_cert,
    /// ssl_verify_mode, ssl_min_version, ssl_keyformat=1 (server.tls); modern, no_modern and
    /// maxconns_fast (already how cellcache behaves). Accepted, checked as memcached checks them, and
    /// ignored (one log line names them): hashpower, slab_reassign, slab_automove,
    /// lru_crawler, lru_maintainer, tail_repair_time, hash_algorithm, *_logbuf_size, and the
    /// other LRU/slab tunables, ssl_ciphers, ssl_wbuf_size, ssl_session_cache,
    /// ssl_kernel_tls. Unknown ones are refused ("Illegal suboption").
    #[arg(short = 'o', long = "extended", value_name = "OPTIONS")]
    pub extended: Vec<String>,
    /// I/O engine: auto (io_uring if the kernel allows it, else epoll), epoll, uring, threads.
    #[arg(long, value_name = "ENGINE")]
    pub io_engine: Option<IoEngineKind>,
    /// Close connections idle this many seconds (0 = never).
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<u64>,
    /// Log filter, e.g. info, debug, cellcache_node=trace.
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Log format: text or json.
    #[arg(long, value_name = "FORMAT", value_parser = parse_log_format)]
    pub log_format: Option<LogFormat>,
    /// Join the ring through this cell's peer address (host:port; `ctl status` prints it
    /// as `peer=`, by default the client port + 10000).
    #[arg(long, value_name = "HOST:PORT")]
    pub join: Option<String>,
    /// Inter-cell port (with client port 0: any free port).
    #[arg(long, value_name = "PORT")]
    pub peer_port: Option<u16>,
    /// Wait outside any ring until `cellcache ctl split CELL --new THIS` brings it in.
    #[arg(long)]
    pub standby: bool,
    /// File with the ring's secret (`cellcache ctl secret new PATH`); every cell of a ring
    /// needs the same one. Without it the peer port is open to anyone who reaches it.
    #[arg(long, value_name = "PATH")]
    pub cluster_secret_file: Option<String>,
    /// PEM certificate chain this cell presents to its peers (mutual TLS between cells,
    /// with --peer-tls-key and --peer-tls-ca; all three or none).
    #[arg(long, value_name = "PATH")]
    pub peer_tls_cert: Option<String>,
    /// PEM private key of --peer-tls-cert.
    #[arg(long, value_name = "PATH")]
    pub peer_tls_key: Option<String>,
    /// PEM certificate of the CA every peer's certificate must chain to.
    #[arg(long, value_name = "PATH")]
    pub peer_tls_ca: Option<String>,
    /// Answer DNS for the ring's name on this port (UDP and TCP; dns.listen, loopback by
    /// default): NAME A/AAAA, _memcache._tcp.NAME SRV, cell-ID.NAME.
    #[arg(long, value_name = "PORT")]
    pub dns_port: Option<u16>,
    /// The ring's DNS name (with --dns-port), e.g. cache.cellcache.local.
    #[arg(long, value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// Admin port (HTTP, for `cellcache ctl`), on --admin-listen.
    #[arg(long, value_name = "PORT")]
    pub admin_port: Option<u16>,
    /// Address of the admin listener; other than loopback it needs --admin-token-file.
    #[arg(long, value_name = "IP")]
    pub admin_listen: Option<std::net::IpAddr>,
    /// File with the admin token: every admin request must then carry it.
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: Option<String>,
    /// Directory of the membership file that lets a restarted cell rejoin its ring
    /// (`off`: none).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<String>,
    /// Run as a plain memcached-compatible server, not a ring member.
    #[arg(long)]
    pub standalone: bool,
    /// The durable store this cell fronts (the cache tier, with --standalone):
    /// redb:PATH or postgres://user@host:port/db.
    #[arg(long, value_name = "SPEC")]
    pub backing_store: Option<String>,
    /// When a write is acknowledged: after the backing store has it (through) or at once
    /// (back).
    #[arg(long, value_name = "through|back")]
    pub write_policy: Option<cellcache_node::config::WritePolicy>,
    /// Write-back: milliseconds a written key stays dirty before it is flushed.
    #[arg(long, value_name = "MS")]
    pub write_back_window: Option<u64>,
    /// Bytes written and not yet in the backing store, at most (then SERVER_ERROR).
    #[arg(long, value_name = "BYTES")]
    pub write_back_max_dirty: Option<usize>,
    /// More verbose logs (-v debug, -vv trace), like memcached's -v.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(flatten)]
    pub scale: crate::scale_flags::ScaleFlags,
}

/// memcached's size syntax: bytes, or with a k/m/g suffix (powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    let lower = s.trim().to_ascii_lowercase();
    let (digits, shift) = match lower.as_bytes().last() {
        Some(b'k') => (&lower[..lower.len() - 1], 10),
        Some(b'm') => (&lower[..lower.len() - 1], 20),
        Some(b'g') => (&lower[..lower.len() - 1], 30),
        _ => (&lower[..], 0),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 1048576, 512k, 1m)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!("unknown log format {other:?} (text or json)")),
    }
}

impl ServeArgs {
    /// Defaults < file < environment < these flags.
    pub fn resolve(&self) -> anyhow::Result<NodeConfig> {
        Ok(self.resolve_with_notes()?.0)
    }

    /// [`ServeArgs::resolve`], plus the memcached options accepted but ignored (to log).
    pub fn resolve_with_notes(&self) -> anyhow::Result<(NodeConfig, Vec<String>)> {
        let mut ignored = Vec::new();
        let mut c = NodeConfig::load(self.config.as_deref())?;
        if !self.listen.is_empty() {
            // Flags replace the configured list; repeated -l add to each other.
            let mut l = cellcache_node::config::ListenAddrs::parse(&self.listen[0])
                .map_err(anyhow::Error::msg)?;
            for spec in &self.listen[1..] {
                l.add_repeated(spec).map_err(anyhow::Error::msg)?;
            }
            c.server.listen = l;
        }
        if let Some(v) = self.port {
            c.server.port = v;
        }
        if let Some(v) = self.io_engine {
            c.server.io_engine = v;
        }
        if let Some(v) = self.threads {
            anyhow::ensure!(
                v > 0,
                "-t 0: the number of threads must be greater than 0 (as memcached: \"Number of \
                 threads must be greater than 0\"); set io.threads = 0 in the config for one \
                 per core"
            );
            c.io.threads = v;
        }
        if let Some(v) = self.listen_backlog {
            c.io.listen_backlog = v;
        }
        if let Some(v) = self.max_connections {
            c.io.max_connections = v;
        }
        if let Some(mb) = self.memory_limit {
            c.store.memory_limit_bytes =
                mb.checked_mul(1 << 20).context("memory limit overflows")?;
        }
        if let Some(item) = self.max_item_size {
            c.set_item_size_max(item)?;
        }
        if self.enable_shutdown {
            c.server.shutdown_command = true;
        }
        if self.disable_flush_all {
            c.server.flush_enabled = false;
        }
        if self.disable_evictions {
            c.store.evictions = false;
        }
        if let Some(policy) = self.eviction {
            c.store.eviction = policy;
        }
        if self.auto_switch {
            c.switching.auto = true;
        }
        if self.disable_cas {
            c.store.cas_enabled = false;
        }
        if let Some(n) = self.max_reqs_per_event {
            anyhow::ensure!(
                n > 0,
                "-R 0: Number of requests per event must be greater than 0 (as memcached)"
            );
            c.server.requests_per_event_max = n;
        }
        if let Some(p) = self.protocol {
            c.server.binding_protocol = p;
        }
        if let Some(path) = &self.auth_file {
            c.server.auth_file = path.clone();
        }
        if self.enable_ssl {
            c.server.tls.enabled = true;
        }
        if let Some(d) = self.detail_delimiter {
            // As memcached's -D: sets the delimiter and turns the counts on.
            c.server.detail_delimiter = d;
            c.server.detail_enabled = true;
        }
        for spec in &self.extended {
            apply_extended(&mut c, spec, &mut ignored)?;
        }
        if let Some(v) = self.idle_timeout {
            c.io.idle_timeout_secs = v;
        }
        if let Some(v) = &self.log_level {
            c.log.level = v.clone();
        }
        if let Some(v) = self.log_format {
            c.log.format = v;
        }
        if let Some(j) = &self.join {
            c.cluster.join = j.clone();
        }
        if let Some(p) = self.peer_port {
            c.cluster.peer_port = p;
        }
        if let Some(p) = self.admin_port {
            c.admin.port = p;
        }
        if let Some(p) = self.dns_port {
            c.dns.port = p;
        }
        if let Some(name) = &self.cluster_name {
            c.dns.name = name.clone();
        }
        if let Some(ip) = self.admin_listen {
            c.admin.listen = ip;
        }
        if let Some(path) = &self.admin_token_file {
            c.admin.token_file = path.clone();
        }
        if let Some(path) = &self.cluster_secret_file {
            c.cluster.secret_file = path.clone();
        }
        if let Some(path) = &self.peer_tls_cert {
            c.cluster.tls.cert_file = path.clone();
        }
        if let Some(path) = &self.peer_tls_key {
            c.cluster.tls.key_file = path.clone();
        }
        if let Some(path) = &self.peer_tls_ca {
            c.cluster.tls.ca_file = path.clone();
        }
        if self.standby {
            c.cluster.standby = true;
        }
        if let Some(d) = &self.state_dir {
            c.cluster.state_dir = d.clone();
        }
        if self.standalone {
            c.cluster.enabled = false;
        }
        if let Some(spec) = &self.backing_store {
            c.tier.backing_store = spec.clone();
        }
        if let Some(p) = self.write_policy {
            c.tier.write_policy = p;
        }
        if let Some(ms) = self.write_back_window {
            c.tier.write_back_window_ms = ms;
        }
        if let Some(bytes) = self.write_back_max_dirty {
            c.tier.write_back_max_dirty_bytes = bytes;
        }
        self.scale.apply(&mut c);
        match self.verbose {
            0 => {}
            1 => c.log.level = "debug".into(),
            _ => c.log.level = "trace".into(),
        }
        // A limit below the store's minimum is raised (and logged) when the cell starts.
        let mut raised = c.clone();
        raised.raise_memory_to_minimum();
        raised.validate()?;
        Ok((c, ignored))
    }
}

/// Extended options (`-o`) that apply to cellcache as they are: `modern`/`no_modern` change
/// nothing in memcached 1.6.18 either, and `maxconns_fast` (answer and close a client past
/// the connection limit) is what cellcache always does.
const EXTENDED_AS_IS: &[&str] = &["modern", "no_modern", "maxconns_fast"];

/// memcached 1.6.18's other extended options: accepted (after memcached's own checks, where
/// it has any) and ignored, because cellcache has no such mechanism (slab classes, LRU
/// segments and crawler, a growing hash table, a log watcher) or does it differently.
const EXTENDED_IGNORED: &[&str] = &[
    "no_maxconns_fast",
    "hashpower",
    "no_hashexpand",
    "hash_algorithm",
    "slab_reassign",
    "no_slab_reassign",
    "slab_automove",
    "slab_automove_ratio",
    "slab_automove_window",
    "slab_automove_freeratio",
    "slab_chunk_max",
    "tail_repair_time",
    "lru_crawler",
    "no_lru_crawler",
    "lru_crawler_sleep",
    "lru_crawler_tocrawl",
    "lru_maintainer",
    "no_lru_maintainer",
    "lru_segmented",
    "no_lru_segmented",
    "hot_lru_pct",
    "warm_lru_pct",
    "hot_max_factor",
    "warm_max_factor",
    "temporary_ttl",
    "track_sizes",
    "watcher_logbuf_size",
    "worker_logbuf_size",
    "read_buf_mem_limit",
    "inline_ascii_response",
    "no_inline_ascii_response",
    "drop_privileges",
    "no_drop_privileges",
    "sock_cookie_id",
    // TLS: rustls chooses its own cipher suites and buffers, keeps no session cache and
    // has no kernel TLS offload here.
    "ssl_ciphers",
    "ssl_wbuf_size",
    "ssl_session_cache",
    "ssl_kernel_tls",
];

/// Applies one `-o` argument (comma-separated `name[=value]` items) as memcached parses it.
fn apply_extended(c: &mut NodeConfig, spec: &str, ignored: &mut Vec<String>) -> anyhow::Result<()> {
    for item in spec.split(',') {
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (item, None),
        };
        let number = || -> anyhow::Result<u64> {
            let v = value.with_context(|| format!("Missing numeric argument for {name}"))?;
            v.parse()
                .with_context(|| format!("-o {name}={v}: not a non-negative number"))
        };
        let text = || -> anyhow::Result<String> {
            value
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .with_context(|| format!("Missing argument for {name}"))
        };
        match name {
            "idle_timeout" => c.io.idle_timeout_secs = number()?,
            "ssl_chain_cert" => c.server.tls.chain_cert = text()?,
            "ssl_key" => c.server.tls.key = text()?,
            "ssl_ca_cert" => c.server.tls.ca_cert = text()?,
            // memcached takes the name or its number (0 tlsv1.0 … 3 tlsv1.3).
            "ssl_min_version" => {
                c.server.tls.min_version = match text()?.as_str() {
                    "0" => "tlsv1.0".into(),
                    "1" => "tlsv1.1".into(),
                    "2" => "tlsv1.2".into(),
                    "3" => "tlsv1.3".into(),
                    name => name.into(),
                }
            }
            "ssl_verify_mode" => {
                let mode = number()?;
                anyhow::ensure!(
                    mode <= 3,
                    "Invalid ssl_verify_mode. Use help to see valid options."
                );
                c.server.tls.verify_mode = mode as u8;
            }
            "ssl_keyformat" => anyhow::ensure!(
                number()? == 1,
                "ssl_keyformat: cellcache reads PEM keys only (ssl_keyformat=1)"
            ),
            _ if EXTENDED_AS_IS.contains(&name) => {}
            _ if EXTENDED_IGNORED.contains(&name) => {
                match name {
                    "hashpower" => {
                        let n = number()?;
                        anyhow::ensure!(n >= 12, "Initial hashtable multiplier of {n} is too low");
                        anyhow::ensure!(n <= 32, "Initial hashtable multiplier of {n} is too high");
                    }
                    "slab_automove" => {
                        anyhow::ensure!(number()? <= 2, "slab_automove must be between 0 and 2")
                    }
                    "tail_repair_time" => anyhow::ensure!(
                        number()? >= 10,
                        "Cannot set tail_repair_time to less than 10 seconds"
                    ),
                    "hash_algorithm" => anyhow::ensure!(
                        matches!(value, Some("jenkins" | "murmur3" | "xxh3")),
                        "Unknown hash_algorithm option (jenkins, murmur3, xxh3)"
                    ),
                    _ => {}
                }
                ignored.push(format!("-o {item}"));
            }
            _ => anyhow::bail!("Illegal suboption {name:?}"),
        }
    }
    Ok(())
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (config, ignored) = args.resolve_with_notes()?;
    init_logging(&config)?;
    if !ignored.is_empty() {
        tracing::warn!(
            "memcached options accepted but ignored (no such mechanism in cellcache): {}",
            ignored.join(" ")
        );
    }
    let shutdown = cellcache_io::Shutdown::new();
    watch_signals(shutdown.clone())?;
    let node = cellcache_node::Node::start(config, shutdown).context("starting the cell")?;
    node.join();
    tracing::info!("stopped");
    Ok(())
}

fn init_logging(config: &NodeConfig) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    // openraft logs every unreachable peer at WARN/ERROR, which is routine while cells
    // join or die; the ring logs what matters itself. A filter naming openraft wins.
    let level = if config.log.level.contains("openraft") {
        config.log.level.clone()
    } else {
        format!("{},openraft=off", config.log.level)
    };
    let filter = EnvFilter::try_new(&level)
        .with_context(|| format!("bad log level {:?}", config.log.level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(log_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr)
        // A log line that cannot be written (the reader of a pipe went away) is dropped:
        // reporting it would write to the same closed stderr, and that panics the thread
        // that logged — the signal thread among them, after which SIGTERM was ignored.
        .log_internal_errors(false);
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Colour codes only for a person at a terminal: a log file or pipe gets plain text, and a
/// non-empty `NO_COLOR` (no-color.org) turns colour off everywhere.
fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// SIGTERM/SIGINT start a graceful shutdown; a second one exits at once.
fn watch_signals(shutdown: cellcache_io::Shutdown) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("cellcache-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if shutdown.is_triggered() {
                    tracing::warn!(signal, "second signal: exiting now");
                    std::process::exit(1);
                }
                tracing::info!(signal, "shutting down: finishing in-flight requests");
                shutdown.trigger();
            }
        })
        .context("starting signal thread")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-I` is memcached's item_size_max: the store's limit is exactly that number, and
    /// everything that must hold such an item grows with it.
    #[test]
    fn item_size_max_flag_is_memcacheds_number() {
        for (flag, bytes) in [("512k", 512 << 10), ("1m", 1 << 20), ("4m", 4 << 20)] {
            let mut c = NodeConfig::default();
            c.set_item_size_max(parse_size(flag).unwrap()).unwrap();
            assert_eq!(c.store.item_size_max_bytes, bytes, "-I {flag}");
            assert!(c.store.slab_size_bytes >= bytes);
            c.validate().unwrap_or_else(|e| panic!("-I {flag}: {e}"));
        }
        let mut c = NodeConfig::default();
        let err = c.set_item_size_max(1000).unwrap_err();
        assert!(err.to_string().contains("less than 1024"), "{err}");
    }

    fn serve(flags: &[&str]) -> anyhow::Result<(NodeConfig, Vec<String>)> {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let argv = std::iter::once("serve").chain(flags.iter().copied());
        Cli::try_parse_from(argv)?.serve.resolve_with_notes()
    }

    /// memcached's -F -M -C -B -R set what they set in memcached, visible in the config.
    #[test]
    fn memcached_flags_set_their_settings() {
        let (c, ignored) = serve(&["-F", "-M", "-C", "-B", "ascii", "-R", "5"]).unwrap();
        assert!(!c.server.flush_enabled);
        assert!(!c.store.evictions);
        assert!(!c.store.cas_enabled);
        assert_eq!(c.server.binding_protocol, BindingProtocol::Ascii);
        assert_eq!(c.server.requests_per_event_max, 5);
        assert!(ignored.is_empty(), "{ignored:?}");
        let (c, _) = serve(&[]).unwrap();
        assert!(c.server.flush_enabled && c.store.evictions && c.store.cas_enabled);
        assert_eq!(c.server.requests_per_event_max, 20, "memcached's default");
        // As memcached: -R 0 and unknown -B values are refused; -B binary is served.
        assert!(serve(&["-R", "0"]).is_err());
        let err = serve(&["-B", "foo"]).unwrap_err().to_string();
        assert!(err.contains("Invalid value for binding protocol"), "{err}");
        let (c, _) = serve(&["-B", "binary"]).unwrap();
        assert_eq!(c.server.binding_protocol, BindingProtocol::Binary);
        // -D sets the stats detail delimiter and turns the counts on, as memcached's.
        let (c, _) = serve(&["-D", "/"]).unwrap();
        assert!(c.server.detail_enabled);
        assert_eq!(c.server.detail_delimiter, '/');
        assert!(!serve(&[]).unwrap().0.server.detail_enabled);
        // -Y names the auth file (read when the cell starts).
        let (c, _) = serve(&["-Y", "/etc/cellcache/auth"]).unwrap();
        assert_eq!(c.server.auth_file, "/etc/cellcache/auth");
        assert!(serve(&[]).unwrap().0.server.auth_file.is_empty());
        // Unknown flags still fail with a usage message.
        let err = serve(&["-9"]).unwrap_err().to_string();
        assert!(err.contains("Usage"), "{err}");
    }

    /// --eviction picks the store's eviction policy by name, over TOML and environment.
    #[test]
    fn eviction_flag_names_the_policy() {
        use cellcache_store::EvictionPolicyKind;
        assert_eq!(
            serve(&[]).unwrap().0.store.eviction,
            EvictionPolicyKind::SlabLru
        );
        let (c, _) = serve(&["--eviction", "s3fifo"]).unwrap();
        assert_eq!(c.store.eviction, EvictionPolicyKind::S3FIFO);
        let (c, _) = serve(&["--eviction", "lru"]).unwrap();
        assert_eq!(c.store.eviction, EvictionPolicyKind::SlabLru);
        let err = serve(&["--eviction", "arc"]).unwrap_err().to_string();
        assert!(err.contains("unknown eviction policy"), "{err}");
    }

    /// -l as memcached: repeated or comma-separated, a repetition of listed addresses
    /// ignored; the TOML key takes a string or a list.
    #[test]
    fn listen_addresses_as_memcached() {
        let addrs = |flags: &[&str]| {
            let (c, _) = serve(flags).unwrap();
            c.server.listen.to_string()
        };
        assert_eq!(addrs(&[]), "127.0.0.1");
        assert_eq!(addrs(&["-l", "127.0.0.2"]), "127.0.0.2");
        assert_eq!(addrs(&["-l", "127.0.0.1", "-l", "::1"]), "127.0.0.1,::1");
        assert_eq!(addrs(&["-l", "127.0.0.1,::1"]), "127.0.0.1,::1");
        assert_eq!(addrs(&["-l", "127.0.0.1", "-l", "127.0.0.1"]), "127.0.0.1");
        // Within one list a duplicate stays, and the bind fails as memcached's does.
        assert_eq!(addrs(&["-l", "127.0.0.1,127.0.0.1"]), "127.0.0.1,127.0.0.1");
        assert!(serve(&["-l", "nonsense"]).is_err());
        // IP:PORT entries keep their port, as memcached's -l 127.0.0.1:21601,127.0.0.1.
        let (c, _) =
            serve(&["-l", "127.0.0.1:21601,[::1]:21602,127.0.0.1", "-p", "21600"]).unwrap();
        assert_eq!(
            c.server.listen.to_string(),
            "127.0.0.1:21601,[::1]:21602,127.0.0.1"
        );
        let addrs: Vec<String> = c.server.addrs().iter().map(|a| a.to_string()).collect();
        assert_eq!(addrs, ["127.0.0.1:21601", "[::1]:21602", "127.0.0.1:21600"]);
        let c = NodeConfig::from_toml_str("[server]\nlisten = [\"127.0.0.1\", \"127.0.0.2\"]\n")
            .unwrap();
        assert_eq!(c.server.addrs().len(), 2);
        let c = NodeConfig::from_toml_str("[server]\nlisten = \"127.0.0.1,127.0.0.3\"\n").unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1,127.0.0.3");
    }

    /// -o: the ones that apply are applied, the rest checked as memcached checks them and
    /// listed for the log line; unknown ones are refused as memcached refuses them.
    #[test]
    fn extended_options_as_memcached() {
        let (c, ignored) = serve(&[
            "-o",
            "modern,idle_timeout=7,hashpower=20,slab_reassign,slab_automove=1",
            "-o",
            "lru_crawler,no_lru_crawler,lru_maintainer,tail_repair_time=30,hash_algorithm=xxh3",
            "-o",
            "maxconns_fast,watcher_logbuf_size=64,no_modern",
        ])
        .unwrap();
        assert_eq!(c.io.idle_timeout_secs, 7);
        assert_eq!(ignored.len(), 9, "{ignored:?}");
        assert!(ignored.contains(&"-o hashpower=20".to_string()));
        for (bad, message) in [
            ("bogus", "Illegal suboption \"bogus\""),
            (",modern", "Illegal suboption \"\""),
            ("hash_algorithm=foo", "Unknown hash_algorithm option"),
            ("hashpower=99", "too high"),
            ("slab_automove=9", "between 0 and 2"),
            ("tail_repair_time=0", "less than 10 seconds"),
            ("hashpower", "Missing numeric argument for hashpower"),
            ("ext_path=/tmp/x:1G", "Illegal suboption"),
        ] {
            let err = format!("{:#}", serve(&["-o", bad]).unwrap_err());
            assert!(err.contains(message), "-o {bad}: {err}");
        }
    }

    /// -Z and memcached's ssl_* suboptions fill `[server.tls]`.
    #[test]
    fn tls_options_as_memcached() {
        let (c, ignored) = serve(&[
            "-Z",
            "-o",
            "ssl_chain_cert=/c.pem,ssl_key=/k.pem,ssl_ca_cert=/ca.pem,ssl_verify_mode=2",
            "-o",
            "ssl_min_version=tlsv1.3,ssl_keyformat=1,ssl_ciphers=HIGH,ssl_session_cache",
        ])
        .unwrap();
        let tls = &c.server.tls;
        assert!(tls.enabled);
        assert_eq!(
            (
                tls.chain_cert.as_str(),
                tls.key.as_str(),
                tls.ca_cert.as_str()
            ),
            ("/c.pem", "/k.pem", "/ca.pem")
        );
        assert_eq!((tls.verify_mode, tls.min_version.as_str()), (2, "tlsv1.3"));
        assert_eq!(ignored, ["-o ssl_ciphers=HIGH", "-o ssl_session_cache"]);
        assert!(!serve(&[]).unwrap().0.server.tls.enabled);
        for (bad, message) in [
            ("ssl_verify_mode=4", "Invalid ssl_verify_mode"),
            ("ssl_keyformat=0", "PEM keys only"),
            ("ssl_key", "Missing argument for ssl_key"),
        ] {
            let err = format!("{:#}", serve(&["-o", bad]).unwrap_err());
            assert!(err.contains(message), "-o {bad}: {err}");
        }
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some("".as_ref())));
        assert!(!log_colour(true, Some("1".as_ref())));
        assert!(!log_colour(false, None));
    }

    #[test]
    fn sizes_parse_like_memcached() {
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12q").is_err());
        assert!(parse_size("99999999999999999g").is_err());
    }
}
