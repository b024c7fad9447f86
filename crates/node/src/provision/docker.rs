//! The `docker` provisioner: a new cell is a container of the project's image on the ring's
//! user-defined docker network, created and removed through the Docker engine API
//! (`autoscale.docker`, docs/provisioners.md).
//!
//! A started container runs `serve -l 0.0.0.0 -p PORT -m MB --join JOIN --divide CELL
//! --provisioned` (plus the ring's secret, a mounted configuration file and the operator's
//! arguments) under a unique name `PREFIX-RING-RANDOM`, which is also its host name, and
//! advertises that name (`CELLCACHE_CLUSTER__ADVERTISE_HOST`): the network's DNS resolves
//! it for every other container, so the address is known before the container has an IP.
//! Its labels (`cellcache.ring`, `cellcache.provisioned`, `cellcache.client`) let any cell
//! find it again by its client address, one that took over as the leader included.
//!
//! `alive` is "the container runs". `stop` gives an absorbed cell's container
//! `stop_grace_ms` to exit by itself (an absorbed cell stops once it sees itself removed),
//! then stops it and removes it; a container that never joined is removed at once.
//! `shutdown` leaves the containers alone: they belong to the platform, not to this cell.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, EndpointSettings, HostConfig, NetworkingConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};

use super::{ProvisionError, Provisioner, StartRequest, Started, StopRequest};
use crate::config::{DockerProvisionerConfig, NodeConfig};

/// Where the ring's secret is mounted in a started container.
pub const SECRET_PATH: &str = "/run/cellcache/cluster-secret";
/// Where `config_file` is mounted in a started container.
pub const CONFIG_PATH: &str = "/etc/cellcache/cellcache.toml";
/// Label: the ring's id (hex).
pub const LABEL_RING: &str = "cellcache.ring";
/// Label: `true` on every container this provisioner created.
pub const LABEL_PROVISIONED: &str = "cellcache.provisioned";
/// Label: the started cell's client address (`NAME:PORT`), as the ring's map holds it.
pub const LABEL_CLIENT: &str = "cellcache.client";
/// Seconds the engine waits after SIGTERM before SIGKILL when stopping a container.
const STOP_TIMEOUT_SECS: i32 = 5;
/// How often `stop` looks whether a container has exited.
const EXIT_POLL: Duration = Duration::from_millis(250);
/// Timeout of one engine request (seconds).
const ENGINE_TIMEOUT_SECS: u64 = 60;

pub struct DockerProvisioner {
    config: DockerProvisionerConfig,
    /// The started cells' client port and `-m`.
    port: u16,
    memory_mb: u64,
    stop_grace: Duration,
    /// Connected (and its API version agreed) on first use, in the runtime.
    engine: tokio::sync::OnceCell<Docker>,
}

/// What a start asks of the engine: the container's name and body.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub name: String,
    pub body: ContainerCreateBody,
}

fn api(what: &str) -> impl FnOnce(bollard::errors::Error) -> ProvisionError + '_ {
    move |e| ProvisionError::Api(format!("docker: {what}: {e}"))
}

fn not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

impl DockerProvisioner {
    pub fn new(config: &NodeConfig) -> Result<DockerProvisioner, ProvisionError> {
        let d = &config.autoscale.docker;
        for (what, v) in [
            ("image", &d.image),
            ("network", &d.network),
            ("socket", &d.socket),
        ] {
            if v.is_empty() {
                return Err(ProvisionError::Config(format!(
                    "autoscale.docker.{what} is empty"
                )));
            }
        }
        if !(d.socket.starts_with("unix://")
            || d.socket.starts_with("tcp://")
            || d.socket.starts_with("http://"))
        {
            return Err(ProvisionError::Config(format!(
                "autoscale.docker.socket {:?}: unix:///PATH or tcp://HOST:PORT",
                d.socket
            )));
        }
        for m in &d.mounts {
            if m.split(':').count() < 2 {
                return Err(ProvisionError::Config(format!(
                    "autoscale.docker.mounts {m:?}: HOST_PATH:CONTAINER_PATH[:ro]"
                )));
            }
        }
        Ok(DockerProvisioner {
            config: d.clone(),
            port: match d.port {
                0 => config.server.port,
                p => p,
            },
            memory_mb: match d.memory_mb {
                0 => (config.store.memory_limit_bytes >> 20).max(1) as u64,
                m => m,
            },
            stop_grace: Duration::from_millis(d.stop_grace_ms),
            engine: tokio::sync::OnceCell::new(),
        })
    }

    async fn engine(&self) -> Result<&Docker, ProvisionError> {
        self.engine
            .get_or_try_init(|| async {
                let socket = &self.config.socket;
                let docker = if socket.starts_with("unix://") {
                    Docker::connect_with_unix(
                        socket,
                        ENGINE_TIMEOUT_SECS,
                        bollard::API_DEFAULT_VERSION,
                    )
                } else {
                    Docker::connect_with_http(
                        socket,
                        ENGINE_TIMEOUT_SECS,
                        bollard::API_DEFAULT_VERSION,
                    )
                }
                .map_err(api("connecting"))?;
                // The engine may be older than the client's API version: agree on one.
                docker
                    .negotiate_version()
                    .await
                    .map_err(api("agreeing on the API version"))
            })
            .await
    }

    /// The container a start creates (no engine involved; unit-tested).
    pub fn spec(&self, request: &StartRequest, suffix: &str) -> ContainerSpec {
        let c = &self.config;
        let ring: String = request.ring.chars().take(8).collect();
        let name = format!("{}-{ring}-{suffix}", c.name_prefix);
        let client = format!("{name}:{}", self.port);
        let mut cmd: Vec<String> = [
            "serve",
            "-l",
            "0.0.0.0",
            "-p",
            &self.port.to_string(),
            "-m",
            &self.memory_mb.to_string(),
            "--join",
            &request.join,
            "--divide",
            &request.divide,
            "--provisioned",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut binds = Vec::new();
        if !c.secret_file.is_empty() {
            binds.push(format!("{}:{SECRET_PATH}:ro", c.secret_file));
            cmd.extend(["--cluster-secret-file".into(), SECRET_PATH.into()]);
        }
        if !c.config_file.is_empty() {
            binds.push(format!("{}:{CONFIG_PATH}:ro", c.config_file));
            cmd.extend(["--config".into(), CONFIG_PATH.into()]);
        }
        if c.mount_socket
            && let Some(path) = c.socket.strip_prefix("unix://")
        {
            binds.push(format!("{path}:{path}"));
        }
        binds.extend(c.mounts.iter().cloned());
        cmd.extend(c.args.iter().cloned());
        let mut env = vec![
            "NO_COLOR=1".to_string(),
            format!("CELLCACHE_CLUSTER__ADVERTISE_HOST={name}"),
        ];
        env.extend(c.env.iter().cloned());
        let labels = HashMap::from([
            (LABEL_RING.to_string(), request.ring.clone()),
            (LABEL_PROVISIONED.to_string(), "true".to_string()),
            (LABEL_CLIENT.to_string(), client),
            ("cellcache.divide".to_string(), request.divide.clone()),
        ]);
        let body = ContainerCreateBody {
            image: Some(c.image.clone()),
            hostname: Some(name.clone()),
            cmd: Some(cmd),
            env: Some(env),
            labels: Some(labels),
            host_config: Some(HostConfig {
                binds: (!binds.is_empty()).then_some(binds),
                network_mode: Some(c.network.clone()),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    c.network.clone(),
                    EndpointSettings {
                        aliases: Some(vec![name.clone()]),
                        ..Default::default()
                    },
                )])),
            }),
            ..Default::default()
        };
        ContainerSpec { name, body }
    }

    /// The label filter finding a stopped cell's containers by its client address.
    pub fn client_filter(client: &str) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_string(),
            vec![
                format!("{LABEL_PROVISIONED}=true"),
                format!("{LABEL_CLIENT}={client}"),
            ],
        )])
    }

    /// The containers a stop means: its handle's, else those labelled with its client.
    async fn containers_of(&self, request: &StopRequest) -> Result<Vec<String>, ProvisionError> {
        let docker = self.engine().await?;
        if let Some(h) = request.handle.as_deref().filter(|h| !h.is_empty()) {
            return Ok(vec![h.to_string()]);
        }
        let Some(client) = request.client.as_deref() else {
            return Ok(Vec::new());
        };
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&Self::client_filter(client))
            .build();
        let found = docker
            .list_containers(Some(options))
            .await
            .map_err(api("listing containers"))?;
        Ok(found.into_iter().filter_map(|c| c.id).collect())
    }

    /// Whether the container runs; `None` when it does not exist.
    async fn running(&self, id: &str) -> Result<Option<bool>, ProvisionError> {
        let docker = self.engine().await?;
        match docker.inspect_container(id, None).await {
            Ok(c) => Ok(Some(c.state.and_then(|s| s.running).unwrap_or(false))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(api("inspecting a container")(e)),
        }
    }
}

#[async_trait::async_trait]
impl Provisioner for DockerProvisioner {
    fn kind(&self) -> &'static str {
        "docker"
    }

    async fn start(&self, request: &StartRequest) -> Result<Started, ProvisionError> {
        let docker = self.engine().await?;
        let suffix = format!("{:08x}", rand::random::<u32>());
        let spec = self.spec(request, &suffix);
        let options = CreateContainerOptionsBuilder::new()
            .name(&spec.name)
            .build();
        let created = docker
            .create_container(Some(options), spec.body)
            .await
            .map_err(api("creating a container"))?;
        if let Err(e) = docker.start_container(&created.id, None).await {
            let remove = RemoveContainerOptionsBuilder::new().force(true).build();
            let _ = docker.remove_container(&created.id, Some(remove)).await;
            return Err(api("starting a container")(e));
        }
        let client = format!("{}:{}", spec.name, self.port);
        tracing::info!(container = %spec.name, id = %created.id, %client, "started a cell");
        Ok(Started {
            handle: created.id,
            client: Some(client),
        })
    }

    async fn alive(&self, started: &Started) -> bool {
        match self.running(&started.handle).await {
            Ok(Some(running)) => running,
            Ok(None) => false,
            // The engine not answering says nothing of the cell: the join timeout decides.
            Err(e) => {
                tracing::warn!(error = %e, "docker: cannot tell whether a started cell runs");
                true
            }
        }
    }

    async fn stop(&self, request: &StopRequest) -> Result<(), ProvisionError> {
        let docker = self.engine().await?;
        for id in self.containers_of(request).await? {
            if request.cell.is_some() {
                let until = tokio::time::Instant::now() + self.stop_grace;
                while self.running(&id).await? == Some(true) && tokio::time::Instant::now() < until
                {
                    tokio::time::sleep(EXIT_POLL).await;
                }
            }
            if self.running(&id).await? == Some(true) {
                tracing::warn!(container = %id, "a provisioned cell's container still runs: stopping it");
                let options = StopContainerOptionsBuilder::new()
                    .t(STOP_TIMEOUT_SECS)
                    .build();
                match docker.stop_container(&id, Some(options)).await {
                    Ok(()) => {}
                    Err(e) if not_found(&e) => continue,
                    Err(e) => return Err(api("stopping a container")(e)),
                }
            }
            let options = RemoveContainerOptionsBuilder::new().force(true).build();
            match docker.remove_container(&id, Some(options)).await {
                Ok(()) => tracing::info!(container = %id, "removed a provisioned cell's container"),
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(api("removing a container")(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "docker_tests.rs"]
mod tests;
