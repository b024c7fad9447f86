//! The `kubernetes` provisioner: the ring's cells are the pods of a StatefulSet
//! (deploy/kubernetes/), and a start or a stop changes its number of replicas through the
//! `scale` subresource (`autoscale.kubernetes`, docs/provisioners.md).
//!
//! - **start**: replicas + 1, as a merge patch carrying the scale's `resourceVersion` (two
//!   deciders racing: the second gets 409 Conflict and fails). The new pod runs the
//!   StatefulSet's one template, which joins the ring through `cellcache-0`: pods share
//!   their arguments, so the new cell cannot be told which cell to divide, and divides the
//!   cell with the largest range (`serve --join` without `--divide`). The request's
//!   `divide` is logged, not followed. The handle is the new pod's name
//!   (`STATEFULSET-ORDINAL`).
//! - **alive**: the pod exists and has not failed (or is not created yet while the
//!   StatefulSet still wants it).
//! - **absorbable**: a StatefulSet scales in from its highest ordinal only, so only the cell
//!   of pod `STATEFULSET-(replicas-1)` (by its pod IP or DNS name) may be absorbed.
//! - **stop**: replicas − 1, only when the cell stopped is that highest-ordinal pod;
//!   otherwise an error (the StatefulSet would remove another pod).
//!
//! `api_url` set: the API server at that URL without credentials (`kubectl proxy`, tests);
//! empty: the pod's service account, else the kubeconfig.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};

use super::{ProvisionError, Provisioner, StartRequest, Started, StopRequest};
use crate::config::KubernetesProvisionerConfig;

pub struct KubernetesProvisioner {
    config: KubernetesProvisionerConfig,
    timeout: Duration,
    /// Connected on first use, in the runtime (a client needs one).
    apis: tokio::sync::OnceCell<(Api<StatefulSet>, Api<Pod>)>,
}

fn api_error(what: &str) -> impl FnOnce(kube::Error) -> ProvisionError + '_ {
    move |e| ProvisionError::Api(format!("kubernetes: {what}: {e}"))
}

/// The merge patch of the scale subresource setting `replicas`, conditional on the scale's
/// `resource_version` when known.
pub fn scale_patch(replicas: i32, resource_version: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({ "spec": { "replicas": replicas } });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
}

/// The host of a `host:port` address (brackets of an IPv6 one removed).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The ordinal of a StatefulSet's pod name `NAME-ORDINAL`.
fn ordinal_of(pod: &str) -> Option<i32> {
    pod.rsplit_once('-').and_then(|(_, n)| n.parse().ok())
}

impl KubernetesProvisioner {
    pub fn new(
        config: &KubernetesProvisionerConfig,
    ) -> Result<KubernetesProvisioner, ProvisionError> {
        if config.statefulset.is_empty() {
            return Err(ProvisionError::Config(
                "autoscale.kubernetes.statefulset is empty".into(),
            ));
        }
        if !config.api_url.is_empty() && config.api_url.parse::<http::Uri>().is_err() {
            return Err(ProvisionError::Config(format!(
                "autoscale.kubernetes.api_url {:?} is not a URL",
                config.api_url
            )));
        }
        Ok(KubernetesProvisioner {
            config: config.clone(),
            timeout: Duration::from_millis(config.timeout_ms.max(1)),
            apis: tokio::sync::OnceCell::new(),
        })
    }

    async fn apis(&self) -> Result<&(Api<StatefulSet>, Api<Pod>), ProvisionError> {
        self.apis
            .get_or_try_init(|| async {
                let mut config = if self.config.api_url.is_empty() {
                    kube::Config::infer().await.map_err(|e| {
                        ProvisionError::Config(format!(
                            "kubernetes: no in-cluster service account nor kubeconfig: {e}"
                        ))
                    })?
                } else {
                    let url = self.config.api_url.parse::<http::Uri>().map_err(|e| {
                        ProvisionError::Config(format!("autoscale.kubernetes.api_url: {e}"))
                    })?;
                    kube::Config::new(url)
                };
                config.connect_timeout = Some(self.timeout);
                config.read_timeout = Some(self.timeout);
                config.write_timeout = Some(self.timeout);
                let namespace = if self.config.namespace.is_empty() {
                    config.default_namespace.clone()
                } else {
                    self.config.namespace.clone()
                };
                let client = kube::Client::try_from(config).map_err(api_error("a client"))?;
                Ok((
                    Api::namespaced(client.clone(), &namespace),
                    Api::namespaced(client, &namespace),
                ))
            })
            .await
    }

    fn pod_name(&self, ordinal: i32) -> String {
        format!("{}-{ordinal}", self.config.statefulset)
    }

    /// The StatefulSet's wanted replicas and the scale's resource version.
    async fn scale(&self) -> Result<(i32, Option<String>), ProvisionError> {
        let (sets, _) = self.apis().await?;
        let scale = sets
            .get_scale(&self.config.statefulset)
            .await
            .map_err(api_error("reading the StatefulSet's scale"))?;
        Ok((
            scale.spec.and_then(|s| s.replicas).unwrap_or(0),
            scale.metadata.resource_version,
        ))
    }

    async fn set_replicas(
        &self,
        replicas: i32,
        resource_version: Option<&str>,
    ) -> Result<(), ProvisionError> {
        let (sets, _) = self.apis().await?;
        let patch = scale_patch(replicas, resource_version);
        sets.patch_scale(
            &self.config.statefulset,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(api_error("scaling the StatefulSet"))?;
        tracing::info!(statefulset = %self.config.statefulset, replicas, "scaled the StatefulSet");
        Ok(())
    }

    async fn pod(&self, name: &str) -> Result<Option<Pod>, ProvisionError> {
        let (_, pods) = self.apis().await?;
        pods.get_opt(name)
            .await
            .map_err(api_error(&format!("reading pod {name}")))
    }

    /// Whether `pod` (named `name`) is the cell at `client`: by its pod IP, or by its
    /// name or DNS name (`NAME.SERVICE[.NAMESPACE…]`).
    fn is_cell(&self, name: &str, pod: &Pod, client: &str) -> bool {
        let host = host_of(client);
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        ip == Some(host)
            || host == name
            || host
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| rest.split('.').next() == Some(self.config.service.as_str()))
    }

    /// The highest-ordinal pod's name and the scale, if that pod is the cell at `client`.
    async fn top_pod_is(
        &self,
        client: &str,
    ) -> Result<(bool, String, i32, Option<String>), ProvisionError> {
        let (replicas, rv) = self.scale().await?;
        if replicas < 1 {
            return Ok((false, String::new(), replicas, rv));
        }
        let name = self.pod_name(replicas - 1);
        let is = self
            .pod(&name)
            .await?
            .is_some_and(|pod| self.is_cell(&name, &pod, client));
        Ok((is, name, replicas, rv))
    }
}

#[async_trait::async_trait]
impl Provisioner for KubernetesProvisioner {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    async fn start(&self, request: &StartRequest) -> Result<Started, ProvisionError> {
        let (replicas, rv) = self.scale().await?;
        tracing::info!(
            divide = %request.divide,
            "kubernetes: a new pod divides the cell with the largest range, not the one asked"
        );
        self.set_replicas(replicas + 1, rv.as_deref()).await?;
        Ok(Started {
            handle: self.pod_name(replicas),
            client: None,
        })
    }

    async fn alive(&self, started: &Started) -> bool {
        match self.pod(&started.handle).await {
            Ok(Some(pod)) => {
                let deleted = pod.metadata.deletion_timestamp.is_some();
                let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
                !deleted && phase != "Failed"
            }
            // Not created yet: alive while the StatefulSet still wants it.
            Ok(None) => match (self.scale().await, ordinal_of(&started.handle)) {
                (Ok((replicas, _)), Some(n)) => n < replicas,
                _ => true,
            },
            // The API not answering says nothing of the pod: the join timeout decides.
            Err(e) => {
                tracing::warn!(error = %e, "kubernetes: cannot tell whether a started pod lives");
                true
            }
        }
    }

    async fn absorbable(&self, client: &str) -> bool {
        match self.top_pod_is(client).await {
            Ok((is, ..)) => is,
            Err(e) => {
                tracing::warn!(error = %e, "kubernetes: cannot tell which pod is the last");
                false
            }
        }
    }

    async fn stop(&self, request: &StopRequest) -> Result<(), ProvisionError> {
        match (&request.cell, &request.client, &request.handle) {
            // Started here and never joined: its pod, if it is still the last one.
            (None, _, Some(handle)) => {
                let (replicas, rv) = self.scale().await?;
                let Some(n) = ordinal_of(handle) else {
                    return Err(ProvisionError::Api(format!(
                        "kubernetes: {handle} is not a StatefulSet's pod name"
                    )));
                };
                if n >= replicas {
                    return Ok(());
                }
                if n != replicas - 1 {
                    return Err(ProvisionError::Api(format!(
                        "kubernetes: pod {handle} is not the StatefulSet's last \
                         ({replicas} replicas): it can only scale in from the top"
                    )));
                }
                self.set_replicas(replicas - 1, rv.as_deref()).await
            }
            (_, Some(client), _) => {
                let (is, name, replicas, rv) = self.top_pod_is(client).await?;
                if !is {
                    return Err(ProvisionError::Api(format!(
                        "kubernetes: the cell at {client} is not the StatefulSet's last pod \
                         ({name}): a StatefulSet scales in from its highest ordinal only"
                    )));
                }
                self.set_replicas(replicas - 1, rv.as_deref()).await
            }
            _ => Err(ProvisionError::Api(
                "kubernetes: a stop needs the cell's client address or its pod".into(),
            )),
        }
    }
}

#[cfg(test)]
#[path = "kubernetes_tests.rs"]
mod tests;
