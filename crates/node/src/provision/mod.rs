//! Provisioners (SPEC E2): how the ring gets a new cell and gives one back, behind one
//! interface the autoscaler calls (`cluster::autoscale`). Each is chosen by
//! `autoscale.provisioner`:
//! - [`local`]: child processes of the deciding cell on this machine (the default);
//! - [`command`]: an operator's program, told what to do in JSON on its standard input;
//! - [`docker`]: containers of the project's image, through the Docker engine API;
//! - [`kubernetes`]: the replicas of a StatefulSet, through the Kubernetes API.
//!
//! A started cell is `cellcache serve` joining the ring through `join` as a division of
//! `divide`, marked `cluster.provisioned` so that autoscaling may absorb it later. Whether it
//! joined is read from the map, not from the provisioner: a provisioner only starts, checks
//! and stops.

pub mod command;
pub mod docker;
pub mod kubernetes;
pub mod local;

use std::sync::Arc;

use serde::Serialize;

use crate::config::{NodeConfig, ProvisionerKind};

/// Why a provisioner could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The operator's program failed (nonzero exit, killed after its timeout, bad output).
    #[error("{0}")]
    Command(String),
    /// Not configured for this provisioner.
    #[error("{0}")]
    Config(String),
    /// A platform's API (the Docker engine, the Kubernetes API server) refused or failed.
    #[error("{0}")]
    Api(String),
}

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ProvisionError {
    let what = what.into();
    move |source| ProvisionError::Io { what, source }
}

/// A cell to start.
#[derive(Debug, Clone, Serialize)]
pub struct StartRequest {
    /// A ring cell's peer address to join through.
    pub join: String,
    /// The cell whose range the new one divides (an id as `ctl status` prints it).
    pub divide: String,
    /// The ring's identity (hex).
    pub ring: String,
}

/// A cell a provisioner started, as it knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Started {
    /// What the provisioner calls it: a process id, a container id, an instance's name.
    pub handle: String,
    /// Its client address (`host:port`), when the provisioner chose it.
    pub client: Option<String>,
}

/// A cell to stop: absorbed (it is leaving or gone), or started and never joined.
#[derive(Debug, Clone, Serialize)]
pub struct StopRequest {
    /// Its id, if it joined.
    pub cell: Option<String>,
    /// Its client address, if known.
    pub client: Option<String>,
    /// Its peer address, if known.
    pub peer: Option<String>,
    /// The handle its start returned, if this cell started it.
    pub handle: Option<String>,
}

/// One way of getting and giving back cells.
#[async_trait::async_trait]
pub trait Provisioner: Send + Sync {
    /// `local`, `command`, …
    fn kind(&self) -> &'static str;

    /// Starts a cell that joins the ring as asked. Returns once it is started, not joined.
    async fn start(&self, request: &StartRequest) -> Result<Started, ProvisionError>;

    /// Whether a cell it started may still join (false: it died, its container exited).
    async fn alive(&self, started: &Started) -> bool;

    /// Stops a cell: one absorbed (given time to stop by itself) or one that never joined.
    async fn stop(&self, request: &StopRequest) -> Result<(), ProvisionError>;

    /// Whether the cell whose client address (`host:port`, as the ring's map holds it) is
    /// `client` may be absorbed now, as far as this provisioner is concerned: the
    /// `kubernetes` one can only give back a StatefulSet's highest-ordinal pod (and says
    /// false when its API does not answer). True by default.
    async fn absorbable(&self, client: &str) -> bool {
        let _ = client;
        true
    }

    /// The ring is shutting down: stop every cell this provisioner started that still runs
    /// (local child processes); others' cells are left to their platform.
    fn shutdown(&self) {}
}

/// The provisioner `config.autoscale` asks for.
pub fn build(config: &NodeConfig) -> Result<Arc<dyn Provisioner>, ProvisionError> {
    match config.autoscale.provisioner {
        ProvisionerKind::Local => Ok(Arc::new(local::Local::new(config)?)),
        ProvisionerKind::Command => Ok(Arc::new(command::Command::new(&config.autoscale.command)?)),
        ProvisionerKind::Docker => Ok(Arc::new(docker::DockerProvisioner::new(config)?)),
        ProvisionerKind::Kubernetes => Ok(Arc::new(kubernetes::KubernetesProvisioner::new(
            &config.autoscale.kubernetes,
        )?)),
    }
}
