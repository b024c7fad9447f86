//! `cellcache-faultproxy`: the fault-injecting TCP proxy of `cellcache_testkit::proxy` as a
//! program, for trying faults by hand or from scripts. Initial faults come from flags;
//! afterwards one command per line on stdin changes them:
//!
//! ```text
//! mode pass|blackhole|drop|reset
//! latency MS [JITTER_MS]
//! bandwidth BYTES_PER_SEC|off
//! flaky PARTS_PER_MILLION    (reset a connection at a random chunk; 0 is off)
//! reset-connections          (RST the connections open now)
//! heal                       (back to forwarding untouched)
//! status
//! ```

use std::io::BufRead;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use cellcache_testkit::proxy::{Faults, Mode, Proxy};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "cellcache-faultproxy",
    about = "Forward TCP with injectable faults"
)]
struct Args {
    /// Address to accept clients on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address to forward to.
    #[arg(long)]
    target: SocketAddr,
    /// Initial mode: pass, blackhole, drop or reset.
    #[arg(long, default_value = "pass", value_parser = parse_mode)]
    mode: Mode,
    /// Added latency per chunk, milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Extra random latency per chunk, up to this many milliseconds.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// Bandwidth cap per direction per connection, bytes per second.
    #[arg(long)]
    bandwidth: Option<u64>,
    /// Chance per chunk, in parts per million, of resetting the connection instead.
    #[arg(long, default_value_t = 0)]
    reset_per_million: u32,
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    match text {
        "pass" => Ok(Mode::Pass),
        "blackhole" => Ok(Mode::Blackhole),
        "drop" => Ok(Mode::Drop),
        "reset" => Ok(Mode::Reset),
        other => Err(format!(
            "unknown mode {other:?} (pass, blackhole, drop, reset)"
        )),
    }
}

fn apply(proxy: &Proxy, line: &str) -> anyhow::Result<()> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut faults = proxy.faults();
    match words[..] {
        [] => return Ok(()),
        ["mode", mode] => faults.mode = parse_mode(mode).map_err(anyhow::Error::msg)?,
        ["latency", ms] | ["latency", ms, _] => {
            faults.latency = Duration::from_millis(ms.parse().context("latency ms")?);
            faults.jitter = match words.get(2) {
                Some(jitter) => Duration::from_millis(jitter.parse().context("jitter ms")?),
                None => Duration::ZERO,
            };
        }
        ["bandwidth", "off"] => faults.bandwidth_bytes_per_sec = None,
        ["bandwidth", rate] => {
            faults.bandwidth_bytes_per_sec = Some(rate.parse().context("bytes per second")?);
        }
        ["flaky", chance] => {
            faults.reset_per_million = chance.parse().context("parts per million")?;
        }
        ["reset-connections"] => {
            proxy.reset_connections();
            return Ok(());
        }
        ["heal"] => faults = Faults::default(),
        ["status"] => {}
        _ => bail!("unknown command {line:?}"),
    }
    proxy.set_faults(faults);
    println!(
        "{} -> {}: {:?}, {} connections, {} bytes forwarded",
        proxy.addr(),
        proxy.target(),
        proxy.faults(),
        proxy.connections_accepted(),
        proxy.bytes_forwarded()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let proxy = Proxy::start(args.listen, args.target)?;
    proxy.set_faults(Faults {
        mode: args.mode,
        latency: Duration::from_millis(args.latency_ms),
        jitter: Duration::from_millis(args.jitter_ms),
        bandwidth_bytes_per_sec: args.bandwidth,
        reset_per_million: args.reset_per_million,
    });
    println!("listening {} -> {}", proxy.addr(), proxy.target());
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin")?;
        if let Err(error) = apply(&proxy, &line) {
            eprintln!("error: {error:#}");
        }
    }
    // stdin closed: keep forwarding until killed, as a long-running proxy would
    loop {
        std::thread::park();
    }
}
