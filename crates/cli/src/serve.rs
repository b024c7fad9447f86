//! `cellcache serve`: flags (memcached's short forms beside long ones), logging, signals.

use anyhow::Context;
use cellcache_node::config::{IoEngineKind, LogFormat, NodeConfig};
use std::net::IpAddr;
use std::path::PathBuf;

/// Flags override the config file and the environment. Short forms are memcached's.
#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML configuration file (see cellcache.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (a ring member advertises it to the others: not 0.0.0.0 unless
    /// cluster.advertise_host is set).
    #[arg(short = 'l', long, value_name = "ADDR")]
    pub listen: Option<IpAddr>,
    /// TCP port for memcached clients (0 = any free port).
    #[arg(short = 'p', long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Worker threads (0 = one per core).
    #[arg(short = 't', long, value_name = "THREADS")]
    pub threads: Option<usize>,
    /// Maximum simultaneous connections.
    #[arg(short = 'c', long, value_name = "MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Memory for items, in megabytes (arena + index, all reserved at start; more than the
    /// machine has available is refused).
    #[arg(short = 'm', long, value_name = "MEGABYTES")]
    pub memory_limit: Option<usize>,
    /// Largest item (key + value + header), e.g. 1m, 512k; raises the slab size if needed.
    #[arg(short = 'I', long, value_name = "SIZE", value_parser = parse_size)]
    pub max_item_size: Option<usize>,
    /// Allow the `shutdown` command (memcached -A).
    #[arg(short = 'A', long)]
    pub enable_shutdown: bool,
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
    /// Join the ring through this cell's client address (host:port).
    #[arg(long, value_name = "HOST:PORT")]
    pub join: Option<String>,
    /// Inter-cell port (with client port 0: any free port).
    #[arg(long, value_name = "PORT")]
    pub peer_port: Option<u16>,
    /// Wait outside any ring until `cellcache ctl split CELL --new THIS` brings it in.
    #[arg(long)]
    pub standby: bool,
    /// Directory of the membership file that lets a restarted cell rejoin its ring
    /// (`off`: none).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<String>,
    /// Run as a plain memcached-compatible server, not a ring member.
    #[arg(long)]
    pub standalone: bool,
    /// More verbose logs (-v debug, -vv trace), like memcached's -v.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
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
        let mut c = NodeConfig::load(self.config.as_deref())?;
        if let Some(v) = self.listen {
            c.server.listen = v;
        }
        if let Some(v) = self.port {
            c.server.port = v;
        }
        if let Some(v) = self.io_engine {
            c.server.io_engine = v;
        }
        if let Some(v) = self.threads {
            c.io.threads = v;
        }
        if let Some(v) = self.max_connections {
            c.io.max_connections = v;
        }
        if let Some(mb) = self.memory_limit {
            c.store.memory_limit_bytes =
                mb.checked_mul(1 << 20).context("memory limit overflows")?;
        }
        if let Some(item) = self.max_item_size {
            // As memcached's -I: the whole item (header and key included) fits `item`, and
            // a slab holds at least one such item.
            let reserve = cellcache_store::ITEM_HEADER_RESERVE_BYTES;
            anyhow::ensure!(
                item > reserve,
                "-I {item} is below the item header reserve {reserve}"
            );
            c.store.item_size_max_bytes = item - reserve;
            c.store.slab_size_bytes = c.store.slab_size_bytes.max(item);
        }
        if self.enable_shutdown {
            c.server.shutdown_command = true;
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
        if self.standby {
            c.cluster.standby = true;
        }
        if let Some(d) = &self.state_dir {
            c.cluster.state_dir = d.clone();
        }
        if self.standalone {
            c.cluster.enabled = false;
        }
        match self.verbose {
            0 => {}
            1 => c.log.level = "debug".into(),
            _ => c.log.level = "trace".into(),
        }
        c.validate()?;
        Ok(c)
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    init_logging(&config)?;
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
        .with_writer(std::io::stderr);
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
    use super::{log_colour, parse_size};

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
