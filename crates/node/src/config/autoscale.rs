//! `[autoscale]`: the ring dividing and absorbing cells by itself (docs/elasticity.md). The
//! watermarks and clocks go to the pure policy (`cellcache_cluster::autoscale`); the
//! provisioner and its sub-table say how a cell is started and stopped.

use serde::{Deserialize, Serialize};

use cellcache_cluster::autoscale::PolicyConfig;

/// How the ring gets and gives back cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ProvisionerKind {
    /// Child processes of the deciding cell, on this machine (the embedded default).
    #[default]
    Local,
    /// An operator's program, told what to do in JSON on its standard input.
    Command,
    /// Containers of the project's image, through the Docker engine API.
    Docker,
    /// The replicas of a StatefulSet, through the Kubernetes API.
    Kubernetes,
}

impl std::str::FromStr for ProvisionerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(ProvisionerKind::Local),
            "command" => Ok(ProvisionerKind::Command),
            "docker" => Ok(ProvisionerKind::Docker),
            "kubernetes" => Ok(ProvisionerKind::Kubernetes),
            _ => Err(format!(
                "unknown provisioner {s:?} (local, command, docker, kubernetes)"
            )),
        }
    }
}

/// `[autoscale]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoscaleConfig {
    /// The ring's consensus leader divides and absorbs cells on memory pressure
    /// (`serve --autoscale`; `ctl autoscale on|off` switches it at run time).
    pub enabled: bool,
    /// `local`, `command`, `docker` or `kubernetes`.
    pub provisioner: ProvisionerKind,
    /// Fill (live bytes / memory limit) at or above which a cell divides.
    pub high_water: f64,
    /// Fill below which a provisioned cell is absorbed.
    pub low_water: f64,
    /// How long a cell must stay beyond a watermark before it counts.
    pub window_ms: u64,
    /// Quiet time after a change before the next (a division racing eviction excepted).
    pub cooldown_ms: u64,
    /// The ring never absorbs below this many cells.
    pub min_cells: usize,
    /// The ring never divides beyond this many cells.
    pub max_cells: usize,
    /// How often the decider samples every cell's memory.
    pub sample_interval_ms: u64,
    /// What a division is assumed to take until one was measured (the lead a cell filling
    /// up is given before it would evict).
    pub division_lead_ms: u64,
    /// A started cell not in the ring this long after it was asked for has failed.
    pub join_timeout_ms: u64,
    /// Wait after a failed start or absorption, doubled per consecutive failure.
    pub retry_backoff_ms: u64,
    /// Most wait after failures.
    pub retry_backoff_max_ms: u64,
    /// The ring's data counts as growing (and no cell is absorbed) only when it gains more
    /// than this fraction of a cell's memory per window.
    pub steady_fill: f64,
    /// Balancing: two neighbours count as skewed when the heavier masters more than `1 +
    /// balance_skew` times the lighter's bytes, and then move the boundary between them (0:
    /// never balance).
    pub balance_skew: f64,
    /// ... and only when the heavier masters at least this fraction of its memory more.
    pub balance_min_fill: f64,
    /// Neighbours are also balanced when the busier executes more than `1 +
    /// balance_load_skew` times the other's key requests per second (0: never by load)...
    pub balance_load_skew: f64,
    /// ... and at least this many more per second.
    pub balance_min_load: f64,
    /// A move of less than this share of the giver's range is not made.
    pub balance_min_share: f64,
    /// Decisions kept for `ctl autoscale status`.
    pub decisions_kept: usize,
    /// `local`: child processes of this cell.
    pub local: LocalProvisionerConfig,
    /// `command`: an operator's program.
    pub command: CommandProvisionerConfig,
    /// `docker`: containers through the Docker engine API.
    pub docker: DockerProvisionerConfig,
    /// `kubernetes`: the replicas of a StatefulSet.
    pub kubernetes: KubernetesProvisionerConfig,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        let p = PolicyConfig::default();
        AutoscaleConfig {
            enabled: false,
            provisioner: ProvisionerKind::Local,
            high_water: p.high_water,
            low_water: p.low_water,
            window_ms: p.window_ms,
            cooldown_ms: p.cooldown_ms,
            min_cells: p.min_cells,
            max_cells: p.max_cells,
            sample_interval_ms: 1_000,
            division_lead_ms: p.division_lead_ms,
            join_timeout_ms: p.join_timeout_ms,
            retry_backoff_ms: p.retry_backoff_ms,
            retry_backoff_max_ms: p.retry_backoff_max_ms,
            steady_fill: p.steady_fill,
            balance_skew: p.balance_skew,
            balance_min_fill: p.balance_min_fill,
            balance_load_skew: p.balance_load_skew,
            balance_min_load: p.balance_min_load,
            balance_min_share: p.balance_min_share,
            decisions_kept: 50,
            local: LocalProvisionerConfig::default(),
            command: CommandProvisionerConfig::default(),
            docker: DockerProvisionerConfig::default(),
            kubernetes: KubernetesProvisionerConfig::default(),
        }
    }
}

impl AutoscaleConfig {
    /// The pure policy's part.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            high_water: self.high_water,
            low_water: self.low_water,
            window_ms: self.window_ms,
            cooldown_ms: self.cooldown_ms,
            min_cells: self.min_cells,
            max_cells: self.max_cells,
            division_lead_ms: self.division_lead_ms,
            join_timeout_ms: self.join_timeout_ms,
            retry_backoff_ms: self.retry_backoff_ms,
            retry_backoff_max_ms: self.retry_backoff_max_ms,
            steady_fill: self.steady_fill,
            balance_skew: self.balance_skew,
            balance_min_fill: self.balance_min_fill,
            balance_load_skew: self.balance_load_skew,
            balance_min_load: self.balance_min_load,
            balance_min_share: self.balance_min_share,
        }
    }
}

/// `[autoscale.local]`: every started cell runs `BINARY serve --config FILE`, FILE being
/// this cell's whole configuration with the new cell's port, `join` and `divide` written in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct LocalProvisionerConfig {
    /// The `cellcache` executable; empty: the one running.
    pub binary: String,
    /// Directory of the started cells' configuration and log files; empty: the
    /// membership file's directory (`cluster.state_dir`), else the system's temporary one.
    pub dir: String,
    /// How long an absorbed cell gets to stop by itself before it is killed (ms); 0: 10 s.
    pub stop_grace_ms: u64,
}

/// `[autoscale.command]`: `PROGRAM ARGS...` is run once per start and per stop, with the
/// request as one JSON object on its standard input (docs/elasticity.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandProvisionerConfig {
    /// The program; required with `provisioner = "command"`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// How long one run may take before it is killed and counted failed (ms).
    pub timeout_ms: u64,
}

impl Default for CommandProvisionerConfig {
    fn default() -> Self {
        CommandProvisionerConfig {
            program: String::new(),
            args: Vec::new(),
            timeout_ms: 60_000,
        }
    }
}

/// `[autoscale.docker]`: every started cell is a container of `image` on `network`, running
/// `serve -l 0.0.0.0 --join JOIN --divide CELL --provisioned` and advertising its container
/// name, which the network's DNS resolves (docs/provisioners.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerProvisionerConfig {
    /// The Docker engine: `unix:///PATH` or `tcp://HOST:PORT` (plain HTTP).
    pub socket: String,
    /// The image holding `cellcache` as its entrypoint (deploy/ring.sh build makes it).
    pub image: String,
    /// The user-defined docker network of the ring (its DNS resolves container names).
    pub network: String,
    /// Containers are named `PREFIX-RING-RANDOM` (RING: the ring id's first 8 hex digits).
    pub name_prefix: String,
    /// The started cells' client port (peer port: + 10000); 0: this cell's.
    pub port: u16,
    /// The started cells' memory limit (`-m`, MiB); 0: this cell's.
    pub memory_mb: u64,
    /// Path, on the Docker host, of the ring's secret: mounted read-only into every started
    /// cell and passed as `--cluster-secret-file`. Empty: none.
    pub secret_file: String,
    /// Path, on the Docker host, of a configuration file mounted read-only into every
    /// started cell and passed as `--config` (e.g. this cell's, so that a started cell that
    /// becomes the leader autoscales alike). Empty: none.
    pub config_file: String,
    /// Mount the engine's unix socket into every started cell at the same path, so it can
    /// provision in turn if it becomes the leader.
    pub mount_socket: bool,
    /// More bind mounts, `HOST_PATH:CONTAINER_PATH[:ro]`.
    pub mounts: Vec<String>,
    /// More environment variables of the started cells, `NAME=VALUE`.
    pub env: Vec<String>,
    /// More arguments for `serve`.
    pub args: Vec<String>,
    /// How long an absorbed cell's container gets to exit by itself before it is stopped
    /// (ms); a container that never joined is removed at once.
    pub stop_grace_ms: u64,
}

impl Default for DockerProvisionerConfig {
    fn default() -> Self {
        DockerProvisionerConfig {
            socket: "unix:///var/run/docker.sock".into(),
            image: "cellcache:dev".into(),
            network: "cellcache-net".into(),
            name_prefix: "cellcache-auto".into(),
            port: 0,
            memory_mb: 0,
            secret_file: String::new(),
            config_file: String::new(),
            mount_socket: true,
            mounts: Vec::new(),
            env: Vec::new(),
            args: Vec::new(),
            stop_grace_ms: 10_000,
        }
    }
}

/// `[autoscale.kubernetes]`: a start adds a replica to the StatefulSet of the ring, an
/// absorption removes its highest-ordinal pod (docs/provisioners.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesProvisionerConfig {
    /// The API server's URL; empty: the in-cluster service account, else `~/.kube/config`
    /// (or `$KUBECONFIG`).
    pub api_url: String,
    /// The StatefulSet's namespace; empty: the service account's (in-cluster), else the
    /// kubeconfig's, else `default`.
    pub namespace: String,
    /// The StatefulSet whose replicas are the ring's cells.
    pub statefulset: String,
    /// Its headless Service (pods are `STATEFULSET-ORDINAL.SERVICE`).
    pub service: String,
    /// How long one API request may take (ms).
    pub timeout_ms: u64,
}

impl Default for KubernetesProvisionerConfig {
    fn default() -> Self {
        KubernetesProvisionerConfig {
            api_url: String::new(),
            namespace: String::new(),
            statefulset: "cellcache".into(),
            service: "cellcache-peers".into(),
            timeout_ms: 10_000,
        }
    }
}
