//! Requests whose parts run on several cells: a multi-key get split by master (the parts
//! merged back into the request's key order), and [`Gather`], which collects the parts of
//! a split get or a broadcast from whichever threads answer.

use std::sync::Arc;

use cellcache_cluster::CellId;
use cellcache_proto::lines;

use super::Cluster;
use super::route::{Ctx, Done, Reply, UNAVAILABLE, dispatch};

/// A multi-key get whose keys have several masters: one get per master, in parallel, the
/// answers merged back into the order of the request's keys.
#[allow(clippy::too_many_arguments)]
pub(super) fn split_get(
    cl: &Arc<Cluster>,
    return_cas: bool,
    touch_exptime: Option<i64>,
    keys: Vec<Vec<u8>>,
    owners: Vec<Option<CellId>>,
    ctx: Ctx,
    done: Done,
) {
    let mut groups: Vec<(Option<CellId>, Vec<usize>)> = Vec::new();
    for (i, o) in owners.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| g == o) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((o.clone(), vec![i])),
        }
    }
    let group_of: Vec<usize> = owners
        .iter()
        .map(|o| groups.iter().position(|(g, _)| g == o).unwrap_or(0))
        .collect();
    let n = groups.len();
    let keys2 = keys.clone();
    let gather = Gather::new(n, move |parts: Vec<Vec<u8>>| {
        done(Reply::Bytes(merge_gets(&keys2, &group_of, &parts)))
    });
    for (gi, (_, idx)) in groups.into_iter().enumerate() {
        let mut sub = Vec::new();
        cellcache_proto::write_retrieve(
            &mut sub,
            return_cas,
            touch_exptime,
            idx.iter().map(|&i| keys[i].as_slice()),
        );
        let g = gather.clone();
        dispatch(
            cl,
            sub,
            ctx,
            Box::new(move |r| {
                g.put(
                    gi,
                    match r {
                        Reply::Bytes(b) => b,
                        Reply::Refused(_) => UNAVAILABLE.to_vec(),
                    },
                )
            }),
        );
    }
}

/// Merges per-master get replies into one, in the order of `keys`. A part that is not a
/// get reply (an error line) becomes the whole reply.
fn merge_gets(keys: &[Vec<u8>], group_of: &[usize], parts: &[Vec<u8>]) -> Vec<u8> {
    let mut blocks: Vec<std::collections::VecDeque<(&[u8], &[u8])>> = Vec::new();
    for p in parts {
        match value_blocks(p) {
            Some(b) => blocks.push(b.into()),
            None => return p.clone(),
        }
    }
    let mut out = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let q = &mut blocks[group_of[i]];
        if q.front().is_some_and(|(k, _)| *k == key.as_slice()) {
            if let Some((_, block)) = q.pop_front() {
                out.extend_from_slice(block);
            }
        }
    }
    out.extend_from_slice(lines::END);
    out
}

/// Splits `VALUE …\r\n<data>\r\n … END\r\n` into (key, whole block); `None` if malformed.
fn value_blocks(reply: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let rest = &reply[at..];
        if rest == lines::END {
            return Some(out);
        }
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let line = &rest[..eol];
        let mut tokens = line.split(|&b| b == b' ');
        if tokens.next()? != b"VALUE" {
            return None;
        }
        let key = tokens.next()?;
        let _flags = tokens.next()?;
        let len: usize = std::str::from_utf8(tokens.next()?).ok()?.parse().ok()?;
        let end = eol.checked_add(2)?.checked_add(len)?.checked_add(2)?;
        if end > rest.len() {
            return None;
        }
        out.push((key, &rest[..end]));
        at += end;
    }
}

/// Collects `n` parts from any threads and calls `finish` with them, in index order.
pub(super) struct Gather {
    /// Lock order: a leaf lock, see `Cluster` (`finish` runs after it is released).
    state: parking_lot::Mutex<GatherState>,
}

type GatherDone = Box<dyn FnOnce(Vec<Vec<u8>>) + Send>;
/// Parts so far, parts missing, and what to call with all of them.
type GatherState = (Vec<Option<Vec<u8>>>, usize, Option<GatherDone>);

impl Gather {
    pub(super) fn new(n: usize, finish: impl FnOnce(Vec<Vec<u8>>) + Send + 'static) -> Arc<Gather> {
        Arc::new(Gather {
            state: parking_lot::Mutex::new((vec![None; n], n, Some(Box::new(finish)))),
        })
    }

    pub(super) fn put(&self, i: usize, part: Vec<u8>) {
        let mut st = self.state.lock();
        if st.0[i].is_none() {
            st.0[i] = Some(part);
            st.1 -= 1;
        }
        if st.1 == 0 {
            if let Some(f) = st.2.take() {
                let parts =
                    st.0.iter_mut()
                        .map(|p| p.take().unwrap_or_default())
                        .collect();
                drop(st);
                f(parts);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_request_order_and_duplicates() {
        let keys: Vec<Vec<u8>> = vec![b"a".to_vec(), b"b".to_vec(), b"a".to_vec(), b"c".to_vec()];
        let group_of = [0, 1, 0, 1];
        let p0 = b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n".to_vec();
        let p1 = b"VALUE c 5 2\r\nyz\r\nEND\r\n".to_vec();
        let merged = merge_gets(&keys, &group_of, &[p0, p1]);
        assert_eq!(
            merged,
            b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nVALUE c 5 2\r\nyz\r\nEND\r\n"
        );
    }

    #[test]
    fn an_error_part_is_the_reply() {
        let keys: Vec<Vec<u8>> = vec![b"a".to_vec(), b"b".to_vec()];
        let merged = merge_gets(&keys, &[0, 1], &[b"END\r\n".to_vec(), UNAVAILABLE.to_vec()]);
        assert_eq!(merged, UNAVAILABLE);
    }

    #[test]
    fn value_blocks_refuse_truncation() {
        assert!(value_blocks(b"VALUE a 0 10\r\nxx\r\nEND\r\n").is_none());
        assert!(value_blocks(b"VALUE a 0 zz\r\nxx\r\nEND\r\n").is_none());
        assert_eq!(value_blocks(b"END\r\n").unwrap().len(), 0);
    }
}
