//! `--tls` end to end: the generator drives a real `cellcache serve -Z` (certificates made
//! here with rcgen, a CA and a server certificate for `localhost` and 127.0.0.1) and every
//! request is answered; a certificate from an unknown CA is refused; `compare --tls
//! --tls-side b` runs cellcache plain against cellcache TLS; Debian's memcached `-Z` is
//! driven too (with `--tls-insecure`). Loopback only, every run a second or less.
//!
//! The cellcache binary is `$CELLCACHE_BIN`, or `target/debug/cellcache` (built when stale,
//! see `cellcache_testkit::process::cellcache_binary`); the engine is
//! `$CELLCACHE_TEST_IO_ENGINE` when set, else the server's default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use cellcache_bench::compare::{free_port, running_as_root};
use cellcache_bench::report::RunReport;
use cellcache_bench::tls::Verification;
use cellcache_bench::{CompareArgs, LoadArgs};
use clap::Parser;

/// A CA and a server certificate it signed, in a directory of their own (removed on drop).
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir =
            cellcache_testkit::process::scratch_dir(&format!("tls-{}", N.fetch_add(1, Relaxed)));
        let pki = Pki { dir };
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(pki.path("ca.crt"), ca.pem()).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(pki.path("server.crt"), cert.pem()).unwrap();
        std::fs::write(pki.path("server.key"), key.serialize_pem()).unwrap();
        // A CA that signed nothing the server holds.
        let other_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let other = params.self_signed(&other_key).unwrap();
        std::fs::write(pki.path("other-ca.crt"), other.pem()).unwrap();
        pki
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// `-Z -o ssl_chain_cert=…,ssl_key=…`, the same for cellcache and memcached.
    fn server_flags(&self) -> String {
        format!(
            "-Z -o ssl_chain_cert={},ssl_key={}",
            self.path("server.crt"),
            self.path("server.key")
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cellcache_bin() -> String {
    cellcache_testkit::process::cellcache_binary()
        .expect("building cellcache")
        .display()
        .to_string()
}

/// `cellcache serve` on `{port}` (a compare template), on the engine under test.
fn cellcache_template(extra: &str) -> String {
    let engine = std::env::var("CELLCACHE_TEST_IO_ENGINE")
        .map(|e| format!(" --io-engine {e}"))
        .unwrap_or_default();
    format!(
        "{} serve -p {{port}} -t {{threads}} -m {{memory_mb}} -l 127.0.0.1{engine} {extra}",
        cellcache_bin()
    )
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `template` (with `{port}`, `{threads}`, `{memory_mb}`) on a free port and waits
/// until it answers `version` over TLS.
fn start(template: &str, pki: &Pki) -> Server {
    const ATTEMPTS: usize = 5;
    let tls = cellcache_bench::tls::TlsTarget::from_args(
        &cellcache_bench::tls::TlsArgs {
            enabled: true,
            tls_ca: Some(pki.path("ca.crt").into()),
            ..Default::default()
        },
        &[],
    )
    .unwrap();
    for _ in 0..ATTEMPTS {
        let port = free_port().unwrap();
        let argv: Vec<String> = template
            .replace("{port}", &port.to_string())
            .replace("{threads}", "1")
            .replace("{memory_mb}", "64")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", argv[0]));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = Server { child, addr };
        if cellcache_bench::client::wait_ready_tls(
            addr,
            Duration::from_secs(10),
            Duration::from_millis(20),
            tls.as_ref(),
        )
        .is_ok()
        {
            return server;
        }
    }
    panic!("{template} did not become ready over TLS on any of {ATTEMPTS} ports");
}

#[derive(Parser)]
struct LoadCli {
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Parser)]
struct CompareCli {
    #[command(flatten)]
    compare: CompareArgs,
}

fn load_args(args: &[&str]) -> LoadArgs {
    LoadCli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .unwrap()
        .load
}

/// Every request answered, none failed, and the preloaded keys hit.
fn check_answered(report: &RunReport) {
    let r = &report.results;
    assert!(r.all.sent > 0, "nothing was sent");
    assert_eq!(r.all.errors, 0, "errors: {:?}", r.errors_by_kind);
    assert_eq!(r.all.sent, r.all.replies);
    assert_eq!(r.connections_failed, 0);
    assert!(r.all.hits > 0, "no hits");
    assert!(r.warmup_sent > 0, "the warm-up ran");
}

#[test]
fn the_generator_speaks_tls_to_cellcache() {
    let pki = Pki::new();
    let server = start(&cellcache_template(&pki.server_flags()), &pki);
    let ca = pki.path("ca.crt");
    let load = load_args(&[
        "--tls",
        "--tls-ca",
        &ca,
        "-c",
        "4",
        "--pipeline",
        "4",
        "--keys",
        "500",
        "--preload",
        "--value-size",
        "10..5000",
        "--warmup",
        "200ms",
        "--duration",
        "800ms",
    ]);
    // As `bench --server localhost:PORT` would: the certificate is checked for `localhost`.
    let targets = [(server.addr, "localhost".to_owned())];
    let report = cellcache_bench::run_load_to(&targets, &load, false).unwrap();
    check_answered(&report);
    let tls = report.config.tls.as_ref().expect("the report says TLS");
    assert_eq!(tls.verification, Verification::Ca);
    assert_eq!(tls.server_names, ["localhost"]);
    assert!(tls.protocol.starts_with("TLSv1_"), "{tls:?}");
    assert!(!tls.cipher_suite.is_empty());
    // Open loop too (the engine's other dispatch path), through the IP as server name.
    let open = load_args(&[
        "--tls",
        "--tls-ca",
        &ca,
        "-c",
        "2",
        "--rate",
        "2000",
        "--keys",
        "500",
        "--preload",
        "--warmup",
        "100ms",
        "--duration",
        "500ms",
    ]);
    let report = cellcache_bench::run_load(&[server.addr], &open, false).unwrap();
    check_answered(&report);
    assert_eq!(report.config.tls.unwrap().server_names, ["127.0.0.1"]);
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let server = start(&cellcache_template(&pki.server_flags()), &pki);
    let other = pki.path("other-ca.crt");
    let load = load_args(&["--tls", "--tls-ca", &other, "--duration", "200ms"]);
    let error = cellcache_bench::run_load(&[server.addr], &load, false).unwrap_err();
    assert!(format!("{error:#}").contains("certificate"), "{error:#}");
    // A name the certificate does not hold is refused as well.
    let ca = pki.path("ca.crt");
    let load = load_args(&[
        "--tls",
        "--tls-ca",
        &ca,
        "--tls-server-name",
        "cache.example",
        "--duration",
        "200ms",
    ]);
    assert!(cellcache_bench::run_load(&[server.addr], &load, false).is_err());
}

#[test]
fn compare_runs_cellcache_plain_against_cellcache_tls() {
    let pki = Pki::new();
    let plain = cellcache_template("");
    let tls = cellcache_template(&pki.server_flags());
    let ca = pki.path("ca.crt");
    let args = CompareCli::try_parse_from([
        "compare",
        "--a-cmd",
        &plain,
        "--b-cmd",
        &tls,
        "--a-name",
        "plain",
        "--b-name",
        "tls",
        "--tls",
        "--tls-ca",
        &ca,
        "--tls-side",
        "b",
        "--repetitions",
        "1",
        "-c",
        "2",
        "--pipeline",
        "2",
        "--keys",
        "200",
        "--preload",
        "--warmup",
        "100ms",
        "--duration",
        "400ms",
    ])
    .unwrap()
    .compare;
    let report = cellcache_bench::compare::compare(&args).unwrap();
    assert!(!report.a_tls && report.b_tls);
    assert_eq!(report.runs.len(), 2);
    for run in &report.runs {
        let cellcache_bench::compare::SideResult::Load(r) = &run.result else {
            panic!("a load experiment")
        };
        check_answered(r);
        assert_eq!(r.config.tls.is_some(), run.side == "tls", "{}", run.side);
    }
    assert!(report.table().contains("(generator speaks TLS)"));
}

#[test]
fn memcached_tls_is_driven_too() {
    let pki = Pki::new();
    let user = if running_as_root() { " -u root" } else { "" };
    let template = format!(
        "memcached -p {{port}} -t 1 -m 64 -l 127.0.0.1 -U 0{user} {}",
        pki.server_flags()
    );
    let server = start(&template, &pki);
    let load = load_args(&[
        "--tls",
        "--tls-insecure",
        "-c",
        "2",
        "--pipeline",
        "4",
        "--keys",
        "200",
        "--preload",
        "--warmup",
        "100ms",
        "--duration",
        "500ms",
    ]);
    let report = cellcache_bench::run_load(&[server.addr], &load, false).unwrap();
    check_answered(&report);
    assert_eq!(
        report.config.tls.unwrap().verification,
        Verification::Insecure
    );
}
