//! The meta commands (mg, ms, md, ma, mn, me) against the store, with memcached 1.6's
//! semantics for the stale / win / recache protocol: an invalidated (stale) item or one
//! whose TTL fell below the `R` threshold hands a win token (`W`) to exactly one reader;
//! later readers see `Z` until the item is rewritten. Quiet mode hides `HD` (and `EN` for
//! mg), never failures.

use crate::cell::Cell;
use crate::counters::LocalCounters;
use cellcache_proto::meta::BinaryKeyBuf;
use cellcache_proto::{
    ArithmeticMode, MetaArithmeticFlags, MetaDeleteFlags, MetaGetFlags, MetaKey, MetaReplyFlags,
    MetaSetFlags, MetaStatus, Request, Response, ReturnFlag, ReturnFlags, SetMode, lines,
    write_meta_header, write_value_end,
};
use cellcache_store::{
    ArithOutcome, ArithRequest, DeleteOptions, DeleteOutcome, Expiry, ItemView, ReadOptions,
    WriteMode, WriteOutcome, WriteRequest,
};

pub fn execute(
    cell: &Cell,
    request: &Request<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    counters.cmd_meta += 1;
    match request {
        Request::MetaGet { key, flags } => meta_get(cell, key, flags, now, out, counters),
        Request::MetaSet { key, value, flags } => {
            meta_set(cell, key, value, flags, now, out, counters)
        }
        Request::MetaDelete { key, flags } => meta_delete(cell, key, flags, now, out, counters),
        Request::MetaArithmetic { key, flags } => meta_arith(cell, key, flags, now, out, counters),
        Request::MetaNoop => out.extend_from_slice(lines::MN),
        Request::MetaDebug { key } => meta_debug(cell, key, now, out),
        _ => {}
    }
}

/// Reply flags common to every meta reply: the key (as sent) and the opaque token.
fn base_flags<'a>(key: &MetaKey<'a>, returns: &ReturnFlags<'a>) -> MetaReplyFlags<'a> {
    MetaReplyFlags {
        key: Some(key.wire),
        opaque: returns.opaque(),
        base64_key: key.base64,
        ..MetaReplyFlags::default()
    }
}

/// Status line with no item attached (`HD`, `NS`, `EX`, `NF`, `EN`), honouring quiet mode.
fn status_only(
    command: &[u8],
    status: MetaStatus,
    quiet: bool,
    returns: &ReturnFlags<'_>,
    flags: &MetaReplyFlags<'_>,
    out: &mut Vec<u8>,
) {
    if quiet && status.hidden_by_quiet(command) {
        return;
    }
    write_meta_header(out, status, 0, returns, flags);
}

/// Fills the per-item reply flags from a view.
fn item_flags<'a>(
    cell: &Cell,
    base: MetaReplyFlags<'a>,
    item: &ItemView<'_>,
    now: u32,
) -> MetaReplyFlags<'a> {
    MetaReplyFlags {
        cas: Some(crate::outcome::cas_out(cell, item.cas)),
        client_flags: Some(item.flags),
        hit_before: Some(item.fetched_before),
        last_access_secs: Some(u64::from(now.saturating_sub(item.slab_last_access_secs))),
        size: Some(item.value.len() as u64),
        ttl_secs: Some(ttl_of(item.expiry, now)),
        won: item.won,
        stale: item.stale,
        win_sent: item.win_token_taken && !item.won,
        ..base
    }
}

/// Remaining TTL as meta reports it: -1 for "never".
fn ttl_of(expiry: Expiry, now: u32) -> i64 {
    expiry.remaining_secs(now).map_or(-1, i64::from)
}

fn meta_get(
    cell: &Cell,
    key: &MetaKey<'_>,
    flags: &MetaGetFlags<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    let mut buf: BinaryKeyBuf = [0; _];
    let k = key.binary(&mut buf);
    counters.cmd_get += 1;
    let touch = flags.new_ttl.map(|t| Expiry::from_protocol(t, now));
    if touch.is_some() {
        counters.cmd_touch += 1;
    }
    let base = base_flags(key, &flags.returns);
    // Decides, under the shard lock, whether this reader should take the win token: the
    // item is stale, or its TTL fell below the recache threshold, and nobody has it yet.
    let wants_win = |item: &ItemView<'_>| {
        !item.win_token_taken
            && (item.stale
                || flags.recache_ttl.is_some_and(|r| {
                    let ttl = ttl_of(item.expiry, now);
                    ttl != -1 && ttl < r
                }))
    };
    let mut claim = false;
    for _attempt in 0..2 {
        let opts = ReadOptions {
            touch,
            no_bump: flags.no_lru_bump,
            claim_win: claim,
        };
        let outcome = cell.store.read(k, now, opts, |item| {
            if !claim && wants_win(&item) {
                return false; // read again, claiming the token
            }
            let mut key_buf = Vec::new();
            let f = with_item_key(item_flags(cell, base, &item, now), &item, &mut key_buf);
            write_hit(out, flags, f, item.value);
            true
        });
        match outcome {
            Some(true) => {
                counters.get_hits += 1;
                return;
            }
            Some(false) => claim = true,
            None => break,
        }
    }
    counters.get_misses += 1;
    if let Some(ttl) = flags.vivify_ttl {
        // Miss with N: create an empty placeholder; the creator gets the win token, and
        // every later reader sees Z until someone stores the real value.
        let req = WriteRequest {
            mode: WriteMode::Add,
            key: k,
            value: b"",
            flags: 0,
            expiry: Expiry::from_protocol(ttl, now),
            compare_cas: None,
            new_cas: crate::outcome::new_cas(cell, flags.new_cas),
            invalidate: false,
        };
        if cell.store.write(&req, now).is_ok() {
            // Not flagged as a base64-key item, as memcached 1.6.18 (`mg YWJl b N30 k`
            // then echoes `kabe`): only `ms` flags it.
            let opts = ReadOptions {
                claim_win: true,
                ..ReadOptions::default()
            };
            let written = cell.store.read(k, now, opts, |item| {
                let mut key_buf = Vec::new();
                let f = with_item_key(item_flags(cell, base, &item, now), &item, &mut key_buf);
                write_hit(out, flags, f, item.value);
            });
            if written.is_some() {
                return;
            }
        }
    }
    status_only(
        b"mg",
        MetaStatus::En,
        flags.quiet,
        &flags.returns,
        &base,
        out,
    );
}

/// The key an item's reply echoes, as memcached: in base64 (with `b`) when the item was
/// stored through a base64 key, else its plain bytes, whatever form the request used.
/// `buf` holds the base64 text.
fn item_key<'k>(item: &ItemView<'k>, buf: &'k mut Vec<u8>) -> (&'k [u8], bool) {
    if item.key_binary {
        buf.clear();
        cellcache_proto::token::base64_encode(item.key, buf);
        (buf.as_slice(), true)
    } else {
        (item.key, false)
    }
}

/// Item reply flags with the key echoed as the item was stored (see [`item_key`]).
fn with_item_key<'f>(
    f: MetaReplyFlags<'f>,
    item: &ItemView<'f>,
    buf: &'f mut Vec<u8>,
) -> MetaReplyFlags<'f> {
    let (key, base64_key) = item_key(item, buf);
    MetaReplyFlags {
        key: Some(key),
        base64_key,
        ..f
    }
}

/// An mg hit: `VA <len> <flags>` and the value when `v` was asked, else `HD <flags>`.
fn write_hit(out: &mut Vec<u8>, flags: &MetaGetFlags<'_>, f: MetaReplyFlags<'_>, value: &[u8]) {
    if flags.value {
        write_meta_header(out, MetaStatus::Va, value.len(), &flags.returns, &f);
        out.extend_from_slice(value);
        write_value_end(out);
    } else {
        write_meta_header(out, MetaStatus::Hd, 0, &flags.returns, &f);
    }
}

fn meta_set(
    cell: &Cell,
    key: &MetaKey<'_>,
    value: &[u8],
    flags: &MetaSetFlags<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    let mut buf: BinaryKeyBuf = [0; _];
    let k = key.binary(&mut buf);
    counters.cmd_set += 1;
    if flags.new_cas.is_some() && !cell.store.config().cas_enabled {
        // memcached -C refuses ms E (there is no CAS to set).
        out.extend_from_slice(lines::CLIENT_ERROR_INVALID_FLAG);
        return;
    }
    let mode = match flags.mode {
        SetMode::Set => WriteMode::Set,
        SetMode::Add => WriteMode::Add,
        SetMode::Replace => WriteMode::Replace,
        SetMode::Append => WriteMode::Append,
        SetMode::Prepend => WriteMode::Prepend,
    };
    let expiry = Expiry::from_protocol(flags.ttl.unwrap_or(0), now);
    let req = WriteRequest {
        mode,
        key: k,
        value,
        flags: flags.client_flags.unwrap_or(0),
        expiry,
        compare_cas: crate::outcome::store_compare(cell, flags.compare_cas),
        new_cas: flags.new_cas,
        invalidate: flags.invalidate,
    };
    let mut result = cell.store.write(&req, now);
    if let (Ok(WriteOutcome::NotStored), Some(ttl), WriteMode::Append | WriteMode::Prepend) =
        (&result, flags.vivify_ttl, mode)
    {
        // ms N: append/prepend to a missing item creates it.
        let create = WriteRequest {
            mode: WriteMode::Add,
            expiry: Expiry::from_protocol(ttl, now),
            ..req
        };
        result = cell.store.write(&create, now);
    }
    let result = crate::outcome::appended_too_large_is_not_stored(result, mode);
    let mut f = base_flags(key, &flags.returns);
    let status = match result {
        Ok(WriteOutcome::Stored { cas }) => {
            if key.base64 {
                // memcached flags the item (ITEM_KEY_BINARY): its key is echoed in base64.
                cell.store.mark_key_binary(k, now);
            }
            f.cas = Some(crate::outcome::cas_out(cell, cas));
            f.client_flags = Some(req.flags);
            f.ttl_secs = Some(ttl_of(expiry, now));
            MetaStatus::Hd
        }
        Ok(WriteOutcome::NotStored) => MetaStatus::Ns,
        Ok(WriteOutcome::Exists) => {
            counters.cas_badval += 1;
            MetaStatus::Ex
        }
        Ok(WriteOutcome::NotFound) => {
            counters.cas_misses += 1;
            MetaStatus::Nf
        }
        Err(e) => {
            out.extend_from_slice(crate::outcome::store_error_line(e, counters));
            return;
        }
    };
    if status != MetaStatus::Hd {
        // Nothing was stored: memcached returns the CAS of the item it did not store, 0.
        f.cas = Some(0);
    }
    status_only(b"ms", status, flags.quiet, &flags.returns, &f, out);
}

fn meta_delete(
    cell: &Cell,
    key: &MetaKey<'_>,
    flags: &MetaDeleteFlags<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    let mut buf: BinaryKeyBuf = [0; _];
    let k = key.binary(&mut buf);
    let f = base_flags(key, &flags.returns);
    let status = if flags.remove_value {
        // x: keep the item (flags, TTL) but drop its value.
        remove_value(
            cell,
            k,
            crate::outcome::zero_compare(cell, flags.compare_cas),
            now,
        )
    } else {
        let opts = DeleteOptions {
            compare_cas: crate::outcome::zero_compare(cell, flags.compare_cas),
            invalidate: flags.invalidate,
            new_cas: crate::outcome::new_cas(cell, flags.new_cas),
        };
        match cell.store.delete(k, now, opts) {
            DeleteOutcome::Deleted => {
                if let (true, Some(ttl)) = (flags.invalidate, flags.new_ttl) {
                    cell.store.touch(k, Expiry::from_protocol(ttl, now), now);
                }
                MetaStatus::Hd
            }
            DeleteOutcome::NotFound => MetaStatus::Nf,
            DeleteOutcome::Exists => MetaStatus::Ex,
        }
    };
    match status {
        MetaStatus::Hd => counters.delete_hits += 1,
        MetaStatus::Nf => counters.delete_misses += 1,
        _ => {}
    }
    status_only(b"md", status, flags.quiet, &flags.returns, &f, out);
}

fn remove_value(cell: &Cell, key: &[u8], compare_cas: Option<u64>, now: u32) -> MetaStatus {
    let Some((client_flags, expiry, cas)) = cell
        .store
        .get(key, now, |item| (item.flags, item.expiry, item.cas))
    else {
        return MetaStatus::Nf;
    };
    if compare_cas.is_some_and(|c| c != cas) {
        return MetaStatus::Ex;
    }
    let req = WriteRequest {
        mode: WriteMode::Replace,
        key,
        value: b"",
        flags: client_flags,
        expiry,
        compare_cas: Some(cas),
        new_cas: None,
        invalidate: false,
    };
    match cell.store.write(&req, now) {
        Ok(WriteOutcome::Stored { .. }) => MetaStatus::Hd,
        Ok(WriteOutcome::Exists) => MetaStatus::Ex,
        _ => MetaStatus::Nf,
    }
}

fn meta_arith(
    cell: &Cell,
    key: &MetaKey<'_>,
    flags: &MetaArithmeticFlags<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    let mut buf: BinaryKeyBuf = [0; _];
    let k = key.binary(&mut buf);
    let decrement = flags.mode == ArithmeticMode::Decrement;
    let req = ArithRequest {
        delta: flags.delta_or_default(),
        decrement,
        autovivify: flags
            .vivify_ttl
            .map(|ttl| (flags.initial_or_default(), Expiry::from_protocol(ttl, now))),
        compare_cas: crate::outcome::zero_compare(cell, flags.compare_cas),
        new_cas: crate::outcome::new_cas(cell, flags.new_cas),
    };
    let mut f = base_flags(key, &flags.returns);
    let (hits, misses) = if decrement {
        (&mut counters.decr_hits, &mut counters.decr_misses)
    } else {
        (&mut counters.incr_hits, &mut counters.incr_misses)
    };
    match cell.store.arith(k, now, &req) {
        Ok(ArithOutcome::Value {
            value,
            cas,
            created,
        }) => {
            *hits += 1;
            if let Some(ttl) = flags.new_ttl {
                cell.store.touch(k, Expiry::from_protocol(ttl, now), now);
            }
            f.cas = Some(crate::outcome::cas_out(cell, cas));
            if flags.returns.contains(ReturnFlag::Ttl) {
                f.ttl_secs = cell.store.get(k, now, |item| ttl_of(item.expiry, now));
            }
            let digits = value.to_string();
            if flags.quiet && !created {
                // memcached 1.6.18: `q` hides a successful ma, even its `VA` (`ma n q v`),
                // but not the creation of a missing counter (`ma n q N0` answers `HD`).
            } else if flags.value {
                write_meta_header(out, MetaStatus::Va, digits.len(), &flags.returns, &f);
                out.extend_from_slice(digits.as_bytes());
                write_value_end(out);
            } else {
                write_meta_header(out, MetaStatus::Hd, 0, &flags.returns, &f);
            }
        }
        Ok(ArithOutcome::NotFound) => {
            *misses += 1;
            status_only(b"ma", MetaStatus::Nf, flags.quiet, &flags.returns, &f, out);
        }
        Ok(ArithOutcome::Exists) => {
            status_only(b"ma", MetaStatus::Ex, flags.quiet, &flags.returns, &f, out);
        }
        Err(e) => out.extend_from_slice(crate::outcome::store_error_line(e, counters)),
    }
}

/// `me <key>`: memcached's debug line, with what cellcache knows of the item.
fn meta_debug(cell: &Cell, key: &MetaKey<'_>, now: u32, out: &mut Vec<u8>) {
    let mut buf: BinaryKeyBuf = [0; _];
    let k = key.binary(&mut buf);
    let opts = ReadOptions {
        no_bump: true,
        ..ReadOptions::default()
    };
    let found = cell.store.read(k, now, opts, |item| {
        let mut key_buf = Vec::new();
        let (echo, _) = item_key(&item, &mut key_buf);
        // The key as text (lossy), as this line has always been written.
        let key = String::from_utf8_lossy(echo);
        let info = format!(
            "exp={} la={} cas={} fetch={} cls=1 size={}",
            ttl_of(item.expiry, now),
            now.saturating_sub(item.slab_last_access_secs),
            crate::outcome::cas_out(cell, item.cas),
            if item.fetched_before { "yes" } else { "no" },
            // memcached's item size (its header, key, value with `\r\n`, CAS, flags), not
            // cellcache's packed encoding: the figure `-I` limits.
            cellcache_store::item_size_bytes(
                item.key.len(),
                item.value.len(),
                item.flags,
                cell.store.config().cas_enabled
            ),
        );
        Response::MetaDebug {
            key: key.as_bytes(),
            info: info.as_bytes(),
        }
        .encode(out);
    });
    if found.is_none() {
        out.extend_from_slice(lines::EN);
    }
}
