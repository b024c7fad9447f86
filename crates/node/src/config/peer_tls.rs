//! Mutual TLS on peer (inter-cell) connections (`[cluster.tls]`), with certificates the
//! operator provides. Off unless all three files are given. See docs/security.md.

use serde::{Deserialize, Serialize};

/// The DNS name a cell's certificate must carry unless `cluster.tls.server_name` says
/// otherwise.
pub const PEER_TLS_SERVER_NAME_DEFAULT: &str = "cellcache";

/// Mutual TLS between cells: every peer connection (links, the peer listener, `serve
/// --join`, a restarted cell's questions) is a TLS 1.2/1.3 session in which both sides
/// present a certificate chained to `ca_file` and carrying `server_name`. It runs before
/// the cluster secret's proofs, which still run inside it when a secret is set. All of
/// `cert_file`, `key_file` and `ca_file` empty: off (plain TCP); some but not all: the
/// cell refuses to start. Every cell of a ring needs it on, with the same CA, or off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerTlsConfig {
    /// PEM file of this cell's certificate chain, its own certificate first
    /// (`--peer-tls-cert`). Presented to the cells it connects to and to those that
    /// connect to it, so it must be valid for both TLS server and client authentication.
    pub cert_file: String,
    /// PEM file of the private key of `cert_file` (PKCS#8, PKCS#1 or SEC1;
    /// `--peer-tls-key`). Keep it readable by the cell's user only.
    pub key_file: String,
    /// PEM file of the certificate authorities a peer's certificate must chain to
    /// (`--peer-tls-ca`): the ring's own CA, not the system's roots.
    pub ca_file: String,
    /// The DNS name every cell's certificate must carry (a subjectAltName): a connecting
    /// cell checks it in the certificate of the cell it reaches, and both sides check the
    /// chain to `ca_file`. One name for the whole ring, so that cells may move between
    /// hosts without new certificates; the same on every cell.
    pub server_name: String,
}

impl Default for PeerTlsConfig {
    fn default() -> Self {
        Self {
            cert_file: String::new(),
            key_file: String::new(),
            ca_file: String::new(),
            server_name: PEER_TLS_SERVER_NAME_DEFAULT.to_string(),
        }
    }
}

impl PeerTlsConfig {
    /// All three files are given: peer connections are TLS.
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty() && !self.key_file.is_empty() && !self.ca_file.is_empty()
    }

    /// `Err` names what is missing when some of the files are given but not all, or the
    /// server name is empty while TLS is on.
    pub fn check(&self) -> Result<(), String> {
        let given = [
            ("cluster.tls.cert_file (--peer-tls-cert)", &self.cert_file),
            ("cluster.tls.key_file (--peer-tls-key)", &self.key_file),
            ("cluster.tls.ca_file (--peer-tls-ca)", &self.ca_file),
        ];
        let missing: Vec<&str> = given
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if missing.len() == given.len() {
            return Ok(());
        }
        if !missing.is_empty() {
            return Err(format!(
                "peer TLS needs a certificate, its key and a CA: {} missing",
                missing.join(" and ")
            ));
        }
        if self.server_name.is_empty() {
            return Err("cluster.tls.server_name must not be empty with peer TLS on".into());
        }
        Ok(())
    }
}
