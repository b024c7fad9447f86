//! The `local` provisioner: a new cell is a child process of the deciding cell, on a free
//! port of this machine. Its configuration is this cell's own (memory, secret, TLS,
//! engine, autoscale — so it can decide in turn if it becomes the leader) with its port,
//! `join`, `divide` and `provisioned` written in, in a file beside its log
//! (`autoscale.local.dir`). `CELLCACHE_*` variables are not passed on: the file says it all.
//!
//! Each child is waited for by a task of its own, so one that dies is reaped at once and
//! reported not alive (the autoscaler then counts the start failed and retries later).
//! An absorbed cell stops by itself once it sees itself removed; `stop` gives it
//! `stop_grace_ms`, then terminates it. When this cell shuts down, the children it started
//! are terminated too (the ring of a machine goes down together); a `kill -9` of this cell,
//! or its absorption, leaves them serving, since they hold their ranges.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{ProvisionError, Provisioner, StartRequest, Started, StopRequest, io_error};
use crate::config::NodeConfig;

/// How often `stop` looks whether the child has exited.
const EXIT_POLL: Duration = Duration::from_millis(100);
/// After SIGTERM, how long before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);
/// Default `stop_grace_ms`.
const STOP_GRACE_DEFAULT: Duration = Duration::from_secs(10);

pub struct Local {
    binary: PathBuf,
    dir: PathBuf,
    /// The configuration every child starts from.
    base: NodeConfig,
    stop_grace: Duration,
    /// Children still running: pid → client address. Lock order: a leaf lock.
    running: Arc<Mutex<HashMap<u32, String>>>,
}

impl Local {
    pub fn new(config: &NodeConfig) -> Result<Local, ProvisionError> {
        let l = &config.autoscale.local;
        let binary = if l.binary.is_empty() {
            std::env::current_exe().map_err(io_error("finding this executable"))?
        } else {
            PathBuf::from(&l.binary)
        };
        let dir = if !l.dir.is_empty() {
            PathBuf::from(&l.dir)
        } else {
            crate::cluster::restart::file_path(&config.cluster.state_dir, "x")
                .and_then(|p| p.parent().map(|d| d.join("cells")))
                .unwrap_or_else(|| std::env::temp_dir().join("cellcache-cells"))
        };
        let mut base = config.clone();
        base.cluster.provisioned = true;
        base.cluster.standby = false;
        base.cluster.peer_port = 0;
        base.admin.port = 0;
        // One DNS entry point is enough; a child would collide with its port.
        base.dns.port = 0;
        Ok(Local {
            binary,
            dir,
            base,
            stop_grace: match l.stop_grace_ms {
                0 => STOP_GRACE_DEFAULT,
                ms => Duration::from_millis(ms),
            },
            running: Arc::default(),
        })
    }

    /// A port free now on the address cells listen on.
    fn free_port(&self) -> Result<u16, ProvisionError> {
        let at = SocketAddr::new(self.base.server.listen.first(), 0);
        let probe = std::net::TcpListener::bind(at).map_err(io_error(format!("binding {at}")))?;
        Ok(probe
            .local_addr()
            .map_err(io_error("reading a probe's port"))?
            .port())
    }

    fn pid_of(&self, r: &StopRequest) -> Option<u32> {
        let running = self.running.lock();
        if let Some(pid) = r.handle.as_ref().and_then(|h| h.parse::<u32>().ok())
            && running.contains_key(&pid)
        {
            return Some(pid);
        }
        let client = r.client.as_ref()?;
        running
            .iter()
            .find(|(_, c)| *c == client)
            .map(|(pid, _)| *pid)
    }

    async fn exited_within(&self, pid: u32, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < until {
            if !self.running.lock().contains_key(&pid) {
                return true;
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        !self.running.lock().contains_key(&pid)
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig) {
        tracing::debug!(pid, error = %e, "signalling a provisioned cell");
    }
}

#[async_trait::async_trait]
impl Provisioner for Local {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn start(&self, request: &StartRequest) -> Result<Started, ProvisionError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(io_error(format!("creating {}", self.dir.display())))?;
        let port = self.free_port()?;
        let mut config = self.base.clone();
        config.server.port = port;
        config.cluster.join = request.join.clone();
        config.cluster.divide = request.divide.clone();
        let toml = toml::to_string(&config)
            .map_err(|e| ProvisionError::Config(format!("writing a cell's configuration: {e}")))?;
        let file = self.dir.join(format!("cell-{port}.toml"));
        std::fs::write(&file, toml).map_err(io_error(format!("writing {}", file.display())))?;
        let log_path = self.dir.join(format!("cell-{port}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(io_error(format!("creating {}", log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(io_error(format!("opening {}", log_path.display())))?;
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.arg("serve").arg("--config").arg(&file);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CELLCACHE_") {
                cmd.env_remove(k);
            }
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(false);
        let mut child = cmd
            .spawn()
            .map_err(io_error(format!("starting {}", self.binary.display())))?;
        let pid = child.id().unwrap_or(0);
        let client = SocketAddr::new(config.server.listen.first(), port).to_string();
        self.running.lock().insert(pid, client.clone());
        let running = self.running.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            running.lock().remove(&pid);
            match status {
                Ok(s) => tracing::info!(pid, status = %s, "provisioned cell exited"),
                Err(e) => tracing::warn!(pid, error = %e, "waiting for a provisioned cell"),
            }
        });
        tracing::info!(pid, %client, log = %log_path.display(), "started a cell");
        Ok(Started {
            handle: pid.to_string(),
            client: Some(client),
        })
    }

    async fn alive(&self, started: &Started) -> bool {
        started
            .handle
            .parse::<u32>()
            .is_ok_and(|pid| self.running.lock().contains_key(&pid))
    }

    async fn stop(&self, request: &StopRequest) -> Result<(), ProvisionError> {
        // Not ours (started by a cell that led before): it stops by itself when removed.
        let Some(pid) = self.pid_of(request) else {
            return Ok(());
        };
        // An absorbed cell stops by itself; one that never joined is still trying to.
        let grace = match request.cell {
            Some(_) => self.stop_grace,
            None => Duration::ZERO,
        };
        if self.exited_within(pid, grace).await {
            return Ok(());
        }
        tracing::warn!(pid, "an absorbed cell still runs: terminating it");
        signal(pid, nix::sys::signal::Signal::SIGTERM);
        if !self.exited_within(pid, TERM_GRACE).await {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
        Ok(())
    }

    fn shutdown(&self) {
        for pid in self.running.lock().keys() {
            tracing::info!(pid, "stopping a cell this one started");
            signal(*pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
}
