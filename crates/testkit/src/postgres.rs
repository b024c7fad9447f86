//! A throwaway PostgreSQL server for tests: `initdb` into a fresh directory, `pg_ctl start`
//! on a free loopback port, trust authentication for one user, stopped and removed on drop.
//!
//! The binaries are Debian's `postgresql` package (`.ci/run` installs it): `pg_ctl` on the
//! `PATH`, else the newest `/usr/lib/postgresql/*/bin`. A test that cannot find them fails
//! with [`PostgresError::NotInstalled`]; it never skips. PostgreSQL refuses to run as root,
//! so as root every command runs as the `postgres` user (`runuser -u postgres`), which owns
//! the directory. [`TempPostgres::stop`] and [`TempPostgres::start`] take the server away and
//! bring it back on the same port and data, for outage tests.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Why the server could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    #[error(
        "PostgreSQL's binaries (pg_ctl, initdb) are neither on PATH nor in \
         /usr/lib/postgresql/*/bin: install Debian's postgresql package (.ci/run does)"
    )]
    NotInstalled,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{command} failed ({status}):\n{output}")]
    Command {
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("PostgreSQL did not accept connections on {addr} within {waited:?}; log:\n{log}")]
    NotReady {
        addr: SocketAddr,
        waited: Duration,
        log: String,
    },
}

/// A running (or stopped) throwaway server.
pub struct TempPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    running: bool,
}

/// The user the tests connect as (trust authentication, loopback only).
pub const USER: &str = "cellcache";

/// How long `pg_ctl` may take to start or stop the server.
const PG_CTL_WAIT_SECS: u32 = 60;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PostgresError {
    let what = what.into();
    move |source| PostgresError::Io { what, source }
}

/// Where `pg_ctl` and `initdb` are.
pub fn bin_dir() -> Result<PathBuf, PostgresError> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let pg_ctl = dir.join("pg_ctl");
            if pg_ctl.exists() && dir.join("initdb").exists() {
                // Debian links them from /usr/local/bin or wraps them in /usr/bin; the real
                // directory holds `postgres` too.
                let real = std::fs::canonicalize(&pg_ctl).map_err(io("resolving pg_ctl"))?;
                if let Some(parent) = real.parent()
                    && parent.join("postgres").exists()
                {
                    return Ok(parent.to_path_buf());
                }
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| PostgresError::NotInstalled)?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, b)| b)
        .ok_or(PostgresError::NotInstalled)
}

impl TempPostgres {
    /// Creates a cluster in a fresh directory and starts it on a free loopback port.
    pub fn start_new() -> Result<TempPostgres, PostgresError> {
        static N: AtomicU32 = AtomicU32::new(0);
        let bin = bin_dir()?;
        let dir = std::env::temp_dir().join(format!(
            "cellcache-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let as_postgres = nix::unistd::geteuid().is_root();
        if as_postgres {
            run(Command::new("chown").arg("postgres:postgres").arg(&dir))?;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io("finding a free port"))?
            .port();
        let mut pg = TempPostgres {
            bin,
            dir,
            port,
            as_postgres,
            running: false,
        };
        let data = pg.data();
        run(pg
            .command("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                USER,
                "-E",
                "UTF8",
                "--no-instructions",
                "-D",
            ])
            .arg(&data))?;
        pg.start()?;
        Ok(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// The connection URL.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Starts the (stopped) server on its port and waits until it accepts connections.
    pub fn start(&mut self) -> Result<(), PostgresError> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.dir.display()
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .args([
                "-o",
                &options,
                "-w",
                "-t",
                &PG_CTL_WAIT_SECS.to_string(),
                "start",
            ]))?;
        self.running = true;
        let waited = Duration::from_secs(u64::from(PG_CTL_WAIT_SECS));
        let until = Instant::now() + waited;
        while TcpStream::connect_timeout(&self.addr(), Duration::from_secs(1)).is_err() {
            if Instant::now() > until {
                return Err(PostgresError::NotReady {
                    addr: self.addr(),
                    waited,
                    log: std::fs::read_to_string(self.log_path()).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the server (fast shutdown: open connections are cut).
    pub fn stop(&mut self) -> Result<(), PostgresError> {
        run(self.command("pg_ctl").arg("-D").arg(self.data()).args([
            "-m",
            "fast",
            "-w",
            "-t",
            &PG_CTL_WAIT_SECS.to_string(),
            "stop",
        ]))?;
        self.running = false;
        Ok(())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// Runs one SQL statement with `psql` and returns its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> Result<String, PostgresError> {
        let psql = self.bin.join("psql");
        let out = Command::new(if psql.exists() {
            psql
        } else {
            PathBuf::from("psql")
        })
        .args([
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &self.url(),
            "-c",
            sql,
        ])
        .output()
        .map_err(io("running psql"))?;
        if !out.status.success() {
            return Err(PostgresError::Command {
                command: format!("psql -c {sql:?}"),
                status: out.status,
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The data directory's parent (the socket and the log are there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn run(command: &mut Command) -> Result<(), PostgresError> {
    let out = command
        .output()
        .map_err(io(format!("running {command:?}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(PostgresError::Command {
        command: format!("{command:?}"),
        status: out.status,
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = run(self.command("pg_ctl").arg("-D").arg(self.data()).args([
                "-m",
                "immediate",
                "-w",
                "stop",
            ]));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
