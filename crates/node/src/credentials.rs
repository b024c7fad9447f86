//! Client credentials: memcached's `-Y` auth file (`server.auth_file`), read once at start.
//!
//! The file holds `user:password` lines, as memcached's: the user is everything before the
//! first `:`, the password everything after it up to the line end (a `\r` before the `\n`
//! is not part of it). Blank lines are skipped; any other line without a `:`, with an empty
//! user or an empty password is refused at start, naming its line (never its content). The
//! same entries serve the text login and SASL PLAIN on the binary protocol (memcached keeps
//! SASL's users in its Cyrus SASL database instead).
//!
//! [`Credentials::check`] compares in constant time: the user and the password are hashed
//! (SHA-256) and compared with every entry's digests with `subtle`, with no early exit, so
//! neither which user exists nor how much of a password matched shows in the time an answer
//! takes. Cells never log in to each other: the ring's own traffic goes over the peer and
//! admin planes, which have credentials of their own (docs/security.md).

use sha2::{Digest, Sha256};
use std::io::Read;
use subtle::ConstantTimeEq;

/// Largest auth file read (a few thousand entries; the file is read whole at start).
pub const AUTH_FILE_BYTES_MAX: u64 = 1 << 20;

/// The users a cell accepts.
pub struct Credentials {
    /// SHA-256 of each user and of its password, in file order.
    entries: Vec<([u8; 32], [u8; 32])>,
    /// The file, as configured (`stats settings` `auth_enabled_ascii`, as memcached's).
    path: String,
}

impl std::fmt::Debug for Credentials {
    /// Never the digests.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("path", &self.path)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// Why the auth file was refused at start.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("reading the auth file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the auth file {path} is larger than {AUTH_FILE_BYTES_MAX} bytes")]
    TooLarge { path: String },
    #[error("the auth file {path}, line {line}: {why} (each line is user:password)")]
    Malformed {
        path: String,
        line: usize,
        why: &'static str,
    },
    #[error("the auth file {path} has no user:password line: nobody could log in")]
    Empty { path: String },
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Credentials {
    /// Reads `path` (`server.auth_file`); an empty path is no authentication. A file others
    /// may read is used, with a warning: it holds passwords in clear.
    pub fn load(path: &str) -> Result<Option<Credentials>, AuthFileError> {
        use std::os::unix::fs::PermissionsExt as _;
        if path.is_empty() {
            return Ok(None);
        }
        let read = |source| AuthFileError::Read {
            path: path.to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        if !meta.is_file() {
            return Err(read(std::io::Error::other("not a file")));
        }
        let mut text = Vec::new();
        file.take(AUTH_FILE_BYTES_MAX + 1)
            .read_to_end(&mut text)
            .map_err(read)?;
        if text.len() as u64 > AUTH_FILE_BYTES_MAX {
            return Err(AuthFileError::TooLarge {
                path: path.to_string(),
            });
        }
        let credentials = Self::parse(path, &text)?;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path,
                "the auth file is readable by other users: chmod 600 it (it holds passwords)"
            );
        }
        Ok(Some(credentials))
    }

    /// The entries of an auth file's contents; `path` names it in errors.
    pub fn parse(path: &str, text: &[u8]) -> Result<Credentials, AuthFileError> {
        let mut entries = Vec::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let malformed = |why| AuthFileError::Malformed {
                path: path.to_string(),
                line: i + 1,
                why,
            };
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| malformed("no ':'"))?;
            let (user, password) = (&line[..colon], &line[colon + 1..]);
            if user.is_empty() {
                return Err(malformed("empty user"));
            }
            if password.is_empty() {
                return Err(malformed("empty password"));
            }
            entries.push((digest(user), digest(password)));
        }
        if entries.is_empty() {
            return Err(AuthFileError::Empty {
                path: path.to_string(),
            });
        }
        Ok(Credentials {
            entries,
            path: path.to_string(),
        })
    }

    /// Whether `user` and `password` are an entry's, compared in constant time (every entry
    /// is compared, whatever matched).
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        let (user, password) = (digest(user), digest(password));
        let mut found = subtle::Choice::from(0);
        for (u, p) in &self.entries {
            found |= u.ct_eq(&user) & p.ct_eq(&password);
        }
        found.into()
    }

    /// The auth file's path, as configured.
    pub fn path(&self) -> &str {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_checks() {
        let c = Credentials::parse("f", b"alice:secret\r\n\nbob:two words\ncarol:a:b\n").unwrap();
        assert!(c.check(b"alice", b"secret"));
        assert!(c.check(b"bob", b"two words"));
        // Everything after the first ':' is the password.
        assert!(c.check(b"carol", b"a:b"));
        for (user, password) in [
            (&b"alice"[..], &b"secret\r"[..]),
            (b"alice", b"secre"),
            (b"alice", b""),
            (b"bob", b"secret"),
            (b"", b""),
            (b"alice:secret", b""),
        ] {
            assert!(!c.check(user, password), "{user:?} {password:?}");
        }
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn malformed_files_name_the_line() {
        for (text, want) in [
            (
                &b"alice:secret\nbob\n"[..],
                "the auth file f, line 2: no ':'",
            ),
            (b":secret", "line 1: empty user"),
            (b"\n\nalice:", "line 3: empty password"),
            (b"", "has no user:password line"),
            (b"\r\n\n", "has no user:password line"),
        ] {
            let e = Credentials::parse("f", text).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn load_reads_the_file_or_says_why_not() {
        use std::os::unix::fs::PermissionsExt as _;
        assert!(Credentials::load("").unwrap().is_none());
        let dir = std::env::temp_dir().join(format!("cellcache-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("auth");
        std::fs::write(&path, "alice:secret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = path.to_str().unwrap();
        let c = Credentials::load(p).unwrap().unwrap();
        assert!(c.check(b"alice", b"secret"));
        assert_eq!(c.path(), p);
        let missing = dir.join("missing");
        let e = Credentials::load(missing.to_str().unwrap()).unwrap_err();
        assert!(matches!(e, AuthFileError::Read { .. }), "{e}");
        let e = Credentials::load(dir.to_str().unwrap()).unwrap_err();
        assert!(matches!(e, AuthFileError::Read { .. }), "{e}");
        std::fs::write(&path, vec![b'a'; AUTH_FILE_BYTES_MAX as usize + 1]).unwrap();
        let e = Credentials::load(p).unwrap_err();
        assert!(matches!(e, AuthFileError::TooLarge { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
