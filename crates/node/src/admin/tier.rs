//! The cache tier on the admin plane: `GET /tier` (the backing store, the write policy and
//! the `tier_*` figures), `POST /tier/policy/{through|back}` (switch the write policy live;
//! `cellcache ctl tier policy`).

use super::{Plane, text};
use crate::config::WritePolicy;
use axum::extract::{Path, State};
use axum::response::Response;
use std::sync::Arc;

const NO_TIER: &[u8] = b"SERVER_ERROR no cache tier on this cell (tier.backing_store)\r\n";

/// `GET /tier`.
pub(super) async fn status(State(plane): State<Arc<Plane>>) -> Response {
    let Some(tier) = &plane.cell.tier else {
        return text(NO_TIER.to_vec());
    };
    let mut out = format!("STAT tier_backing_store {}\r\n", tier.describe()).into_bytes();
    tier.write_stats(&mut out);
    out.extend_from_slice(b"END\r\n");
    text(out)
}

/// `POST /tier/policy/{policy}`.
pub(super) async fn policy(
    State(plane): State<Arc<Plane>>,
    Path(policy): Path<String>,
) -> Response {
    let Some(tier) = &plane.cell.tier else {
        return text(NO_TIER.to_vec());
    };
    match policy.parse::<WritePolicy>() {
        Ok(p) => {
            tier.set_policy(p);
            text(format!("OK write policy {}\r\n", p.name()).into_bytes())
        }
        Err(e) => text(format!("CLIENT_ERROR {e}\r\n").into_bytes()),
    }
}
