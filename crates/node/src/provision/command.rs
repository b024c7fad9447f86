//! The `command` provisioner: an operator's program does the work (a cloud VM, a job on a
//! scheduler), run once per request with the request as one JSON object on its standard
//! input:
//!
//! ```json
//! {"action":"start","join":"10.0.0.5:21211","divide":"3","ring":"9f2c…"}
//! {"action":"stop","cell":"3.8","client":"10.0.0.7:11211","peer":"10.0.0.7:21211","handle":"i-0abc"}
//! ```
//!
//! A start must launch `cellcache serve --join JOIN --divide DIVIDE --provisioned` (with the
//! ring's secret and settings) somewhere and exit 0; what it prints on its standard output,
//! trimmed, is the cell's handle (an instance id), given back on its stop. `alive` runs it
//! with `{"action":"alive","handle":…}`: exit 0 means the cell may still join. A nonzero
//! exit, or a run past `timeout_ms` (then killed), fails the request; its standard error's
//! last line is the reason logged. Examples: `deploy/provisioners/`.

use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::io::AsyncWriteExt;

use super::{ProvisionError, Provisioner, StartRequest, Started, StopRequest, io_error};
use crate::config::CommandProvisionerConfig;

/// Most bytes of a run's output kept.
const OUTPUT_BYTES_MAX: usize = 64 * 1024;

pub struct Command {
    program: String,
    args: Vec<String>,
    timeout: Duration,
}

#[derive(Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
enum Request<'a> {
    Start(&'a StartRequest),
    Alive { handle: &'a str },
    Stop(&'a StopRequest),
}

impl Command {
    pub fn new(config: &CommandProvisionerConfig) -> Result<Command, ProvisionError> {
        if config.program.is_empty() {
            return Err(ProvisionError::Config(
                "autoscale.command.program is empty".into(),
            ));
        }
        Ok(Command {
            program: config.program.clone(),
            args: config.args.clone(),
            timeout: Duration::from_millis(config.timeout_ms),
        })
    }

    /// Runs the program with `request` on its input; its trimmed standard output.
    async fn run(&self, request: &Request<'_>) -> Result<String, ProvisionError> {
        let input = serde_json::to_vec(request)
            .map_err(|e| ProvisionError::Command(format!("encoding the request: {e}")))?;
        let mut child = tokio::process::Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io_error(format!("running {}", self.program)))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A program that does not read its input is its own business: ignore EPIPE.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.write_all(b"\n").await;
        }
        let out = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(r) => r.map_err(io_error(format!("running {}", self.program)))?,
            // Dropping the future kills the child (kill_on_drop).
            Err(_) => {
                return Err(ProvisionError::Command(format!(
                    "{} took longer than {} ms",
                    self.program,
                    self.timeout.as_millis()
                )));
            }
        };
        let text =
            |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(OUTPUT_BYTES_MAX)]).into_owned();
        if !out.status.success() {
            let stderr = text(&out.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
            return Err(ProvisionError::Command(format!(
                "{} exited with {}{}",
                self.program,
                out.status,
                last.map(|l| format!(": {}", l.trim())).unwrap_or_default()
            )));
        }
        Ok(text(&out.stdout).trim().to_string())
    }
}

#[async_trait::async_trait]
impl Provisioner for Command {
    fn kind(&self) -> &'static str {
        "command"
    }

    async fn start(&self, request: &StartRequest) -> Result<Started, ProvisionError> {
        let handle = self.run(&Request::Start(request)).await?;
        Ok(Started {
            handle,
            client: None,
        })
    }

    async fn alive(&self, started: &Started) -> bool {
        if started.handle.is_empty() {
            return true;
        }
        match self
            .run(&Request::Alive {
                handle: &started.handle,
            })
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::info!(handle = %started.handle, error = %e, "provisioned cell not alive");
                false
            }
        }
    }

    async fn stop(&self, request: &StopRequest) -> Result<(), ProvisionError> {
        self.run(&Request::Stop(request)).await.map(|_| ())
    }
}
