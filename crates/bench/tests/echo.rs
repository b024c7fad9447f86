//! `cellcache bench echo`, the limit a cell is measured against, driven by `bench compare`
//! as the measurement does: two echo servers on different engines, side by side.
//! Checks that every get is answered as a hit of the generator's value size, nothing is an
//! error, and the comparison reports the servers' CPU per reply.

use cellcache_bench::CompareArgs;
use clap::Parser;

#[derive(Parser)]
struct CompareCli {
    #[command(flatten)]
    compare: CompareArgs,
}

fn echo_cmd(engine: &str) -> String {
    format!(
        "{} bench echo -p {{port}} -t {{threads}} --io-engine {engine} --value-size 64",
        cellcache_testkit::process::cellcache_binary()
            .expect("building cellcache")
            .display()
    )
}

#[test]
fn echo_servers_answer_every_request_as_a_hit_and_their_cpu_is_reported() {
    let (a, b) = (echo_cmd("epoll"), echo_cmd("uring"));
    let args = CompareCli::try_parse_from([
        "compare",
        "--a-cmd",
        &a,
        "--b-cmd",
        &b,
        "--a-name",
        "echo-epoll",
        "--b-name",
        "echo-uring",
        "--repetitions",
        "1",
        "-c",
        "4",
        "--duration",
        "1s",
        "--keys",
        "100",
        "--value-size",
        "64",
        "--get-ratio",
        "0.8",
    ])
    .unwrap()
    .compare;
    let report = cellcache_bench::compare::compare(&args).unwrap();
    let metric = |name: &str| {
        report
            .metrics
            .iter()
            .find(|m| m.metric == name)
            .unwrap_or_else(|| panic!("no {name} in {}", report.table()))
    };
    assert_eq!(metric("errors").a.max + metric("errors").b.max, 0.0);
    let hits = metric("hit_ratio");
    assert_eq!((hits.a.min, hits.b.min), (1.0, 1.0), "every get is a hit");
    let cpu = metric("server_cpu_us_per_reply");
    assert!(
        cpu.a.min > 0.0 && cpu.b.min > 0.0,
        "both servers' CPU per reply is measured: {}",
        report.table()
    );
    for run in &report.runs {
        assert!(run.server_cpu_secs.is_some_and(|s| s > 0.0), "{run:?}");
    }
}
