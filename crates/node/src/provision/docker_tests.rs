//! The `docker` provisioner: the container a start asks for (no engine), and start, alive
//! and stop against a fake Docker engine on loopback (axum) serving the endpoints it calls.

use std::collections::HashMap as Map;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::*;

fn provisioner(edit: impl FnOnce(&mut NodeConfig)) -> DockerProvisioner {
    let mut config = NodeConfig::default();
    config.server.port = 11211;
    config.store.memory_limit_bytes = 64 << 20;
    edit(&mut config);
    DockerProvisioner::new(&config).expect("valid configuration")
}

fn request() -> StartRequest {
    StartRequest {
        join: "172.31.77.11:21211".into(),
        divide: "3".into(),
        ring: "9f2c0011aabbccdd".into(),
    }
}

#[test]
fn a_start_runs_serve_joining_and_dividing_under_a_resolvable_name() {
    let p = provisioner(|_| {});
    let s = p.spec(&request(), "0000abcd");
    assert_eq!(s.name, "cellcache-auto-9f2c0011-0000abcd");
    let b = &s.body;
    assert_eq!(b.image.as_deref(), Some("cellcache:dev"));
    assert_eq!(b.hostname.as_deref(), Some(s.name.as_str()));
    assert_eq!(
        b.cmd.clone().unwrap_or_default().join(" "),
        "serve -l 0.0.0.0 -p 11211 -m 64 --join 172.31.77.11:21211 --divide 3 --provisioned"
    );
    let env = b.env.clone().unwrap_or_default();
    assert!(env.contains(&format!("CELLCACHE_CLUSTER__ADVERTISE_HOST={}", s.name)));
    let labels = b.labels.clone().unwrap_or_default();
    assert_eq!(labels[LABEL_RING], "9f2c0011aabbccdd");
    assert_eq!(labels[LABEL_PROVISIONED], "true");
    assert_eq!(
        labels[LABEL_CLIENT],
        "cellcache-auto-9f2c0011-0000abcd:11211"
    );
    let host = b.host_config.clone().unwrap_or_default();
    assert_eq!(host.network_mode.as_deref(), Some("cellcache-net"));
    // The engine's socket, so that the cell can provision if it becomes the leader.
    assert_eq!(
        host.binds,
        Some(vec![
            "/var/run/docker.sock:/var/run/docker.sock".to_string()
        ])
    );
    let endpoints = b
        .networking_config
        .clone()
        .and_then(|n| n.endpoints_config)
        .unwrap_or_default();
    assert_eq!(
        endpoints["cellcache-net"].aliases,
        Some(vec![s.name.clone()])
    );
}

#[test]
fn secret_config_mounts_env_and_args_are_passed_on() {
    let p = provisioner(|c| {
        let d = &mut c.autoscale.docker;
        d.image = "registry.example/cellcache:1".into();
        d.network = "ring".into();
        d.name_prefix = "cc".into();
        d.port = 11300;
        d.memory_mb = 256;
        d.secret_file = "/srv/ring.secret".into();
        d.config_file = "/srv/cellcache.toml".into();
        d.mount_socket = false;
        d.mounts = vec!["/srv/tok:/run/tok:ro".into()];
        d.env = vec!["RUST_LOG=debug".into()];
        d.args = vec!["--admin-listen".into(), "0.0.0.0".into()];
    });
    let s = p.spec(&request(), "1");
    assert_eq!(s.name, "cc-9f2c0011-1");
    let cmd = s.body.cmd.clone().unwrap_or_default().join(" ");
    assert_eq!(
        cmd,
        format!(
            "serve -l 0.0.0.0 -p 11300 -m 256 --join 172.31.77.11:21211 --divide 3 \
             --provisioned --cluster-secret-file {SECRET_PATH} --config {CONFIG_PATH} \
             --admin-listen 0.0.0.0"
        )
    );
    let host = s.body.host_config.clone().unwrap_or_default();
    assert_eq!(
        host.binds,
        Some(vec![
            format!("/srv/ring.secret:{SECRET_PATH}:ro"),
            format!("/srv/cellcache.toml:{CONFIG_PATH}:ro"),
            "/srv/tok:/run/tok:ro".to_string(),
        ])
    );
    assert!(
        s.body
            .env
            .clone()
            .unwrap_or_default()
            .contains(&"RUST_LOG=debug".to_string())
    );
    assert_eq!(
        s.body.labels.clone().unwrap_or_default()[LABEL_CLIENT],
        "cc-9f2c0011-1:11300"
    );
}

#[test]
fn a_stopped_cell_is_found_by_its_labels() {
    let f = DockerProvisioner::client_filter("cc-1:11211");
    assert_eq!(
        f["label"],
        vec![
            "cellcache.provisioned=true".to_string(),
            "cellcache.client=cc-1:11211".to_string()
        ]
    );
}

#[test]
fn bad_configurations_are_refused() {
    let mut c = NodeConfig::default();
    c.autoscale.docker.image.clear();
    assert!(matches!(
        DockerProvisioner::new(&c),
        Err(ProvisionError::Config(_))
    ));
    let mut c = NodeConfig::default();
    c.autoscale.docker.socket = "/var/run/docker.sock".into();
    assert!(DockerProvisioner::new(&c).is_err());
    let mut c = NodeConfig::default();
    c.autoscale.docker.mounts = vec!["nocolon".into()];
    assert!(DockerProvisioner::new(&c).is_err());
}

#[tokio::test]
async fn an_engine_that_is_not_there_fails_the_start() {
    let mut c = NodeConfig::default();
    c.autoscale.docker.socket = "unix:///nonexistent/docker.sock".into();
    let p = DockerProvisioner::new(&c).expect("valid configuration");
    assert!(matches!(
        p.start(&request()).await,
        Err(ProvisionError::Api(_))
    ));
}

/// One container of the fake engine.
struct FakeContainer {
    labels: Map<String, String>,
    running: bool,
    /// Inspections left before it exits by itself (an absorbed cell stopping); None: never.
    exits_after: Option<u32>,
}

#[derive(Default)]
struct Engine {
    containers: Map<String, FakeContainer>,
    next: u32,
    /// Every call: method and path without the API version.
    calls: Vec<String>,
    /// The last create's query name and body.
    created: Option<(String, Value)>,
    /// Answer creates with this status.
    fail_create: Option<u16>,
    /// Containers created exit by themselves after this many inspections.
    exits_after: Option<u32>,
}

type Shared = Arc<Mutex<Engine>>;

fn error(code: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(json!({ "message": message }))).into_response()
}

/// Every engine endpoint the provisioner calls, by hand: `/vX.Y/containers/...`.
async fn engine(
    State(s): State<Shared>,
    method: Method,
    uri: Uri,
    Query(query): Query<Map<String, String>>,
    body: Bytes,
) -> Response {
    let mut e = s.lock();
    let path = uri.path();
    let path = match path.strip_prefix("/v") {
        Some(rest) => rest.find('/').map_or(path, |i| &rest[i..]),
        None => path,
    };
    e.calls.push(format!("{method} {path}"));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["version"]) => {
            axum::Json(json!({"Version": "20.10.24", "ApiVersion": "1.41"})).into_response()
        }
        ("POST", ["containers", "create"]) => {
            if let Some(code) = e.fail_create {
                return error(code, "fake: no");
            }
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let labels = serde_json::from_value(body["Labels"].clone()).unwrap_or_default();
            e.next += 1;
            let id = format!("c{}", e.next);
            let exits_after = e.exits_after;
            e.containers.insert(
                id.clone(),
                FakeContainer {
                    labels,
                    running: false,
                    exits_after,
                },
            );
            e.created = Some((query.get("name").cloned().unwrap_or_default(), body));
            axum::Json(json!({"Id": id, "Warnings": []})).into_response()
        }
        ("GET", ["containers", "json"]) => {
            let filters: Value = query
                .get("filters")
                .and_then(|f| serde_json::from_str(f).ok())
                .unwrap_or(Value::Null);
            let wanted: Vec<(String, String)> = filters["label"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l.as_str()?.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let found: Vec<Value> = e
                .containers
                .iter()
                .filter(|(_, c)| wanted.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
                .map(|(id, c)| json!({"Id": id, "Labels": c.labels}))
                .collect();
            axum::Json(found).into_response()
        }
        (m, ["containers", id, action]) => {
            let Some(c) = e.containers.get_mut(*id) else {
                return error(404, "fake: no such container");
            };
            match (m, *action) {
                ("POST", "start") => c.running = true,
                ("POST", "stop") => c.running = false,
                ("GET", "json") => {
                    if let Some(n) = c.exits_after.as_mut() {
                        if *n == 0 {
                            c.running = false;
                        } else {
                            *n -= 1;
                        }
                    }
                    return axum::Json(json!({"Id": id, "State": {"Running": c.running}}))
                        .into_response();
                }
                _ => return error(400, "fake: unknown call"),
            }
            StatusCode::NO_CONTENT.into_response()
        }
        ("DELETE", ["containers", id]) => match e.containers.remove(*id) {
            Some(_) => StatusCode::NO_CONTENT.into_response(),
            None => error(404, "fake: no such container"),
        },
        _ => error(400, "fake: unknown call"),
    }
}

/// A fake engine on loopback and a provisioner using it (stop grace: 300 ms).
async fn fake() -> (Shared, DockerProvisioner) {
    let shared: Shared = Arc::default();
    let app = Router::new().fallback(engine).with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let p = provisioner(|c| {
        c.autoscale.docker.socket = format!("tcp://{at}");
        c.autoscale.docker.stop_grace_ms = 300;
    });
    (shared, p)
}

fn calls(e: &Shared, verb: &str) -> usize {
    e.lock()
        .calls
        .iter()
        .filter(|c| c.starts_with(verb))
        .count()
}

#[tokio::test]
async fn start_creates_and_starts_a_labelled_container_that_is_alive_while_it_runs() {
    let (e, p) = fake().await;
    let started = p.start(&request()).await.expect("start");
    let (name, body) = e.lock().created.clone().expect("created");
    assert!(name.starts_with("cellcache-auto-9f2c0011-"), "{name}");
    assert_eq!(started.client, Some(format!("{name}:11211")));
    assert_eq!(body["Image"], "cellcache:dev");
    assert_eq!(body["Hostname"], name.as_str());
    assert_eq!(
        body["Labels"][LABEL_CLIENT],
        format!("{name}:11211").as_str()
    );
    assert_eq!(body["HostConfig"]["NetworkMode"], "cellcache-net");
    assert_eq!(body["Cmd"][0], "serve");
    assert!(p.alive(&started).await);
    e.lock()
        .containers
        .get_mut(&started.handle)
        .expect("container")
        .running = false;
    assert!(!p.alive(&started).await);
    e.lock().containers.clear();
    assert!(!p.alive(&started).await);
}

#[tokio::test]
async fn an_absorbed_cell_that_exits_by_itself_is_only_removed() {
    let (e, p) = fake().await;
    e.lock().exits_after = Some(1);
    let started = p.start(&request()).await.expect("start");
    // Another cell led when it was started: found by its client address.
    let stop = StopRequest {
        cell: Some("2".into()),
        client: started.client.clone(),
        peer: None,
        handle: None,
    };
    p.stop(&stop).await.expect("stop");
    assert!(e.lock().containers.is_empty());
    assert_eq!(calls(&e, "POST /containers/c1/stop"), 0);
    assert_eq!(calls(&e, "DELETE /containers/c1"), 1);
    // Gone already: nothing to do, no error.
    p.stop(&stop).await.expect("stop again");
}

#[tokio::test]
async fn an_absorbed_cell_still_running_after_the_grace_is_stopped_and_removed() {
    let (e, p) = fake().await;
    let started = p.start(&request()).await.expect("start");
    let stop = StopRequest {
        cell: Some("2".into()),
        client: started.client.clone(),
        peer: None,
        handle: None,
    };
    let at = std::time::Instant::now();
    p.stop(&stop).await.expect("stop");
    assert!(at.elapsed() >= Duration::from_millis(300));
    assert_eq!(calls(&e, "POST /containers/c1/stop"), 1);
    assert!(e.lock().containers.is_empty());
}

#[tokio::test]
async fn a_cell_that_never_joined_is_removed_at_once_by_its_handle() {
    let (e, p) = fake().await;
    let started = p.start(&request()).await.expect("start");
    let stop = StopRequest {
        cell: None,
        client: started.client.clone(),
        peer: None,
        handle: Some(started.handle.clone()),
    };
    let at = std::time::Instant::now();
    p.stop(&stop).await.expect("stop");
    assert!(at.elapsed() < Duration::from_millis(300));
    assert!(e.lock().containers.is_empty());
}

#[tokio::test]
async fn engine_errors_are_provision_errors() {
    let (e, p) = fake().await;
    e.lock().fail_create = Some(500);
    assert!(matches!(
        p.start(&request()).await,
        Err(ProvisionError::Api(_))
    ));
    e.lock().fail_create = Some(409);
    match p.start(&request()).await {
        Err(ProvisionError::Api(m)) => assert!(m.contains("409"), "{m}"),
        other => panic!("expected an API error, got {other:?}"),
    }
}
