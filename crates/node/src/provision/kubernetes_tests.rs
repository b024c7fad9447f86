//! The `kubernetes` provisioner against a fake API server on loopback (axum) serving the
//! few endpoints it calls: the StatefulSet's scale (GET, PATCH) and pods (GET).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::*;

#[derive(Default)]
struct Fake {
    replicas: i32,
    version: u64,
    /// Every PATCH: its content type and body.
    patches: Vec<(String, Value)>,
    /// Pod name → (IP, phase).
    pods: HashMap<String, (String, String)>,
    /// Answer every request with this status.
    fail: Option<u16>,
}

type Shared = Arc<Mutex<Fake>>;

fn status(code: u16, reason: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("fake: {reason}"), "reason": reason, "code": code,
    });
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(body)).into_response()
}

fn scale_json(f: &Fake, ns: &str, name: &str) -> Response {
    axum::Json(json!({
        "apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": f.version.to_string()},
        "spec": {"replicas": f.replicas},
        "status": {"replicas": f.replicas},
    }))
    .into_response()
}

async fn get_scale(State(s): State<Shared>, Path((ns, name)): Path<(String, String)>) -> Response {
    let f = s.lock();
    if let Some(code) = f.fail {
        return status(code, "InternalError");
    }
    scale_json(&f, &ns, &name)
}

async fn patch_scale(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut f = s.lock();
    let kind = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    f.patches.push((kind, patch.clone()));
    if let Some(code) = f.fail {
        return status(code, "InternalError");
    }
    if let Some(rv) = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        && rv != f.version.to_string()
    {
        return status(409, "Conflict");
    }
    if let Some(n) = patch.pointer("/spec/replicas").and_then(Value::as_i64) {
        f.replicas = n as i32;
        f.version += 1;
    }
    scale_json(&f, &ns, &name)
}

async fn get_pod(State(s): State<Shared>, Path((ns, name)): Path<(String, String)>) -> Response {
    let f = s.lock();
    if let Some(code) = f.fail {
        return status(code, "InternalError");
    }
    match f.pods.get(&name) {
        Some((ip, phase)) => axum::Json(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "status": {"phase": phase, "podIP": ip},
        }))
        .into_response(),
        None => status(404, "NotFound"),
    }
}

/// A fake API server with a StatefulSet `cellcache` of `replicas` in namespace `ring`,
/// each pod N at 10.0.0.N; and a provisioner pointed at it.
async fn fake(replicas: i32) -> (Shared, KubernetesProvisioner) {
    let shared: Shared = Arc::new(Mutex::new(Fake {
        replicas,
        version: 7,
        ..Fake::default()
    }));
    for n in 0..replicas {
        shared.lock().pods.insert(
            format!("cellcache-{n}"),
            (format!("10.0.0.{n}"), "Running".into()),
        );
    }
    let app = Router::new()
        .route(
            "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale",
            get(get_scale).patch(patch_scale),
        )
        .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = KubernetesProvisionerConfig {
        api_url: format!("http://{at}"),
        namespace: "ring".into(),
        timeout_ms: 5_000,
        ..KubernetesProvisionerConfig::default()
    };
    (
        shared,
        KubernetesProvisioner::new(&config).expect("provisioner"),
    )
}

fn start_request() -> StartRequest {
    StartRequest {
        join: "10.0.0.0:21211".into(),
        divide: "1".into(),
        ring: "9f2c".into(),
    }
}

#[tokio::test]
async fn start_adds_a_replica_with_a_conditional_merge_patch() {
    let (f, p) = fake(3).await;
    let started = p.start(&start_request()).await.expect("start");
    assert_eq!(started.handle, "cellcache-3");
    assert_eq!(started.client, None);
    let f = f.lock();
    assert_eq!(f.replicas, 4);
    assert_eq!(f.patches.len(), 1);
    let (kind, body) = &f.patches[0];
    assert_eq!(kind, "application/merge-patch+json");
    assert_eq!(
        body,
        &json!({"spec": {"replicas": 4}, "metadata": {"resourceVersion": "7"}})
    );
}

#[tokio::test]
async fn alive_while_the_pod_runs_or_is_still_wanted() {
    let (f, p) = fake(3).await;
    let started = p.start(&start_request()).await.expect("start");
    // Not created yet, but wanted.
    assert!(p.alive(&started).await);
    f.lock()
        .pods
        .insert("cellcache-3".into(), ("10.0.0.3".into(), "Pending".into()));
    assert!(p.alive(&started).await);
    f.lock()
        .pods
        .insert("cellcache-3".into(), ("10.0.0.3".into(), "Failed".into()));
    assert!(!p.alive(&started).await);
    // Gone and no longer wanted.
    f.lock().pods.remove("cellcache-3");
    f.lock().replicas = 3;
    assert!(!p.alive(&started).await);
}

#[tokio::test]
async fn only_the_highest_ordinal_pod_is_absorbable_and_stopped() {
    let (f, p) = fake(4).await;
    assert!(p.absorbable("10.0.0.3:11211").await);
    assert!(p.absorbable("cellcache-3.cellcache-peers:11211").await);
    assert!(
        p.absorbable("cellcache-3.cellcache-peers.ring.svc:11211")
            .await
    );
    assert!(!p.absorbable("10.0.0.2:11211").await);
    assert!(!p.absorbable("cellcache-30.cellcache-peers:11211").await);
    let stop = |client: &str| StopRequest {
        cell: Some("3.1".into()),
        client: Some(client.into()),
        peer: None,
        handle: None,
    };
    // Another pod: refused, nothing patched.
    assert!(matches!(
        p.stop(&stop("10.0.0.1:11211")).await,
        Err(ProvisionError::Api(_))
    ));
    assert!(f.lock().patches.is_empty());
    p.stop(&stop("10.0.0.3:11211")).await.expect("stop");
    let f = f.lock();
    assert_eq!(f.replicas, 3);
    assert_eq!(
        f.patches[0].1,
        json!({"spec": {"replicas": 3}, "metadata": {"resourceVersion": "7"}})
    );
}

#[tokio::test]
async fn a_pod_that_never_joined_is_scaled_away_by_its_handle() {
    let (f, p) = fake(3).await;
    let started = p.start(&start_request()).await.expect("start");
    let request = StopRequest {
        cell: None,
        client: None,
        peer: None,
        handle: Some(started.handle.clone()),
    };
    p.stop(&request).await.expect("stop");
    assert_eq!(f.lock().replicas, 3);
    // Already gone: nothing to do.
    p.stop(&request).await.expect("stop again");
    assert_eq!(f.lock().patches.len(), 2);
}

#[tokio::test]
async fn api_failures_and_conflicts_are_provision_errors() {
    let (f, p) = fake(3).await;
    f.lock().fail = Some(500);
    assert!(matches!(
        p.start(&start_request()).await,
        Err(ProvisionError::Api(_))
    ));
    assert!(!p.absorbable("10.0.0.2:11211").await);
    // A conflict: another decider scaled between the read and the patch.
    f.lock().fail = None;
    let (replicas, _) = p.scale().await.expect("scale");
    f.lock().version += 1;
    let e = p.set_replicas(replicas + 1, Some("7")).await;
    match e {
        Err(ProvisionError::Api(m)) => assert!(m.contains("409") || m.contains("Conflict"), "{m}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(f.lock().replicas, 3);
}

#[test]
fn patches_and_names() {
    assert_eq!(scale_patch(5, None), json!({"spec": {"replicas": 5}}));
    assert_eq!(host_of("10.0.0.3:11211"), "10.0.0.3");
    assert_eq!(host_of("[fd00::3]:11211"), "fd00::3");
    assert_eq!(ordinal_of("cellcache-12"), Some(12));
    assert_eq!(ordinal_of("cellcache"), None);
}
