//! The client operations of a shard: write (set/add/replace/append/prepend/cas), read,
//! touch, delete and arith, each on one key under the shard lock.

use super::*;

impl Shard {
    pub fn write(
        &mut self,
        hash: u64,
        req: &WriteRequest<'_>,
        now: u32,
        ctx: &Ctx<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        Self::check_key(req.key)?;
        self.check_size(req.key.len(), req.value.len(), req.flags)?;
        let existing = self.lookup(hash, req.key, now);
        let present = existing.is_some();
        match req.mode {
            WriteMode::Add if present => return Ok(WriteOutcome::NotStored),
            WriteMode::Replace | WriteMode::Append | WriteMode::Prepend if !present => {
                return Ok(WriteOutcome::NotStored);
            }
            _ => {}
        }
        let mut state = 0;
        let mut keep_expiry = None;
        if let Some(expected) = req.compare_cas {
            match &existing {
                None => return Ok(WriteOutcome::NotFound),
                Some((_, _, h)) if h.cas != expected => {
                    if req.invalidate && expected < h.cas {
                        // As memcached's CAS_STALE: the new value stays stale, keeps the
                        // item's TTL and whether its win token was already handed out.
                        state = CTRL_STALE | (h.ctrl & CTRL_WIN);
                        keep_expiry = Some(Expiry::at(h.expiry));
                    } else {
                        return Ok(WriteOutcome::Exists);
                    }
                }
                Some(_) => {}
            }
        }
        let cas = ctx.cas_for(req.new_cas);
        let loc = match (req.mode, existing) {
            (WriteMode::Append | WriteMode::Prepend, Some((_, loc, h))) => {
                let total = h.value_len + req.value.len();
                self.check_size(req.key.len(), total, h.flags)?;
                // The old value must be copied out first: making room may evict or compact it.
                let mut buf = std::mem::take(&mut self.scratch);
                buf.clear();
                // Exact, not amortized growth: the scratch buffer's bound is one largest item.
                buf.reserve_exact(total);
                let old = &self.arena[loc as usize + h.value_offset()..loc as usize + h.total_len];
                if req.mode == WriteMode::Append {
                    buf.extend_from_slice(old);
                    buf.extend_from_slice(req.value);
                } else {
                    buf.extend_from_slice(req.value);
                    buf.extend_from_slice(old);
                }
                let r = self.store_item(
                    hash,
                    req.key,
                    &buf,
                    h.flags,
                    Expiry::at(h.expiry),
                    cas,
                    state | (h.ctrl & CTRL_KEY_BINARY),
                    now,
                );
                self.scratch = buf;
                r?
            }
            _ => self.store_item(
                hash,
                req.key,
                req.value,
                req.flags,
                keep_expiry.unwrap_or(req.expiry),
                cas,
                state,
                now,
            )?,
        };
        // memcached's total_items: items stored by clients. A replica's copy, a hand-off
        // and a touch's rewrite store no new item.
        self.counters.total_items += 1;
        self.emit_put(loc, ctx);
        Ok(WriteOutcome::Stored { cas })
    }

    pub fn read<R>(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        opts: ReadOptions,
        ctx: &Ctx<'_>,
        f: impl FnOnce(ItemView<'_>) -> R,
    ) -> Option<R> {
        // A touch is applied after the value is read (as memcached's gat/mg T): a touch to
        // a past or negative exptime still returns the value once, then the item expires.
        let (slot, loc, h) = match self.lookup_why(hash, key, now) {
            Lookup::Live(slot, loc, h) => (slot, loc, h),
            why => {
                self.counters.get_misses += 1;
                self.counters.get_expired += u64::from(matches!(why, Lookup::Expired));
                return None;
            }
        };
        debug_assert_eq!(self.index.loc_at(slot), Some(loc));
        self.counters.get_hits += 1;
        let s = slab_of(loc, self.slab_size);
        let last_access = self.slabs.meta[s as usize].last_access;
        let ctrl = h.ctrl;
        let mut won = false;
        let mut new_ctrl = ctrl;
        if opts.claim_win && ctrl & CTRL_WIN == 0 {
            new_ctrl |= CTRL_WIN;
            won = true;
        }
        if !opts.no_bump {
            new_ctrl |= CTRL_FETCHED;
            self.bump_freq(slot);
            self.slabs.meta[s as usize].last_access = now;
            self.policy.on_access(s);
        }
        // Hot items are read from several threads: write the byte only when it changes, so
        // repeated hits do not dirty the item's cache line.
        if new_ctrl != ctrl {
            self.arena[loc as usize] = new_ctrl;
        }
        let b = loc as usize;
        let result = f(ItemView {
            key: &self.arena[b + h.key_offset..b + h.key_offset + h.key_len],
            value: &self.arena[b + h.value_offset()..b + h.total_len],
            flags: h.flags,
            cas: h.cas,
            expiry: opts.touch.unwrap_or(Expiry::at(h.expiry)),
            fetched_before: ctrl & CTRL_FETCHED != 0,
            stale: ctrl & CTRL_STALE != 0,
            won,
            win_token_taken: ctrl & CTRL_WIN != 0,
            slab_last_access_secs: last_access,
            item_bytes: h.total_len,
            key_binary: ctrl & CTRL_KEY_BINARY != 0,
        });
        if let Some(expiry) = opts.touch {
            // The item was just found under this lock, so the touch finds it too (it may only
            // fail to rewrite a header without an expiry field when memory is exhausted, and
            // then the item keeps its old expiry, as a failed memcached touch does).
            self.touch(hash, key, expiry, now, ctx);
        }
        Some(result)
    }

    pub fn touch(
        &mut self,
        hash: u64,
        key: &[u8],
        expiry: Expiry,
        now: u32,
        ctx: &Ctx<'_>,
    ) -> bool {
        let Some((_, loc, h)) = self.lookup(hash, key, now) else {
            return false;
        };
        if let Some(off) = h.expiry_offset {
            let at = loc as usize + off;
            self.arena[at..at + 4].copy_from_slice(&expiry.as_unix_secs().to_le_bytes());
        } else if !expiry.is_never() {
            // No expiry field to overwrite: write a new version with the same CAS and state.
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.reserve_exact(h.key_len + h.value_len);
            buf.extend_from_slice(
                &self.arena[loc as usize + h.key_offset..loc as usize + h.total_len],
            );
            let (k, v) = buf.split_at(h.key_len);
            let state = h.ctrl & CTRL_STATE;
            let r = self.store_item(hash, k, v, h.flags, expiry, h.cas, state, now);
            self.scratch = buf;
            match r {
                // The item moved to another slab: report its full state, so that a range scan
                // that already passed the new slab still gets the item through the feed.
                Ok(new_loc) => {
                    self.emit_put(new_loc, ctx);
                    return true;
                }
                Err(_) => return false,
            }
        }
        ctx.emit(ChangeKind::Touch { key, expiry });
        true
    }

    /// Marks the item as stored through a base64 key (meta `b`), in place.
    pub fn mark_key_binary(&mut self, hash: u64, key: &[u8], now: u32) {
        if let Some((_, loc, h)) = self.lookup(hash, key, now) {
            self.arena[loc as usize] = h.ctrl | CTRL_KEY_BINARY;
        }
    }

    pub fn delete(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        opts: DeleteOptions,
        ctx: &Ctx<'_>,
    ) -> DeleteOutcome {
        let Some((slot, loc, h)) = self.lookup(hash, key, now) else {
            return DeleteOutcome::NotFound;
        };
        if opts.compare_cas.is_some_and(|c| c != h.cas) {
            return DeleteOutcome::Exists;
        }
        if opts.invalidate {
            // A new version with a new CAS (memcached's md I): copy the key and value out
            // first, since making room for the new version may move or evict the old one.
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.reserve_exact(h.key_len + h.value_len);
            buf.extend_from_slice(
                &self.arena[loc as usize + h.key_offset..loc as usize + h.total_len],
            );
            let (k, v) = buf.split_at(h.key_len);
            let state = (h.ctrl & (CTRL_FETCHED | CTRL_KEY_BINARY)) | CTRL_STALE;
            let cas = ctx.cas_for(opts.new_cas);
            let r = self.store_item(hash, k, v, h.flags, Expiry::at(h.expiry), cas, state, now);
            self.scratch = buf;
            match r {
                Ok(new_loc) => self.emit_put(new_loc, ctx),
                // No room for the new version: mark the old one stale in place, keeping its
                // CAS (the invalidation itself must not fail for lack of memory).
                Err(_) => {
                    if let Some((_, loc, h)) = self.lookup(hash, key, now) {
                        self.arena[loc as usize] = (h.ctrl | CTRL_STALE) & !CTRL_WIN;
                        self.emit_put(loc, ctx);
                    }
                }
            }
        } else {
            self.unlink(slot, loc, &h, Unlink::Deleted);
            ctx.emit(ChangeKind::Delete { key });
        }
        DeleteOutcome::Deleted
    }

    pub fn arith(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        req: &ArithRequest,
        ctx: &Ctx<'_>,
    ) -> Result<ArithOutcome, StoreError> {
        Self::check_key(key)?;
        let Some((_, loc, h)) = self.lookup(hash, key, now) else {
            let Some((initial, expiry)) = req.autovivify else {
                return Ok(ArithOutcome::NotFound);
            };
            let cas = ctx.cas_for(req.new_cas);
            let digits = initial.to_string();
            let loc = self.store_item(hash, key, digits.as_bytes(), 0, expiry, cas, 0, now)?;
            self.counters.total_items += 1;
            self.emit_put(loc, ctx);
            return Ok(ArithOutcome::Value {
                value: initial,
                cas,
                created: true,
            });
        };
        if req.compare_cas.is_some_and(|c| c != h.cas) {
            return Ok(ArithOutcome::Exists);
        }
        let value = &self.arena[loc as usize + h.value_offset()..loc as usize + h.total_len];
        let current = parse_counter(value).ok_or(StoreError::NonNumeric)?;
        let new = if req.decrement {
            current.saturating_sub(req.delta)
        } else {
            current.wrapping_add(req.delta)
        };
        // memcached keeps the value's length when the result is shorter, padding the digits
        // with spaces (it rewrites the number in place); a longer result grows the value.
        let mut digits = new.to_string().into_bytes();
        if digits.len() < value.len() {
            digits.resize(value.len(), b' ');
        }
        self.check_size(key.len(), digits.len(), h.flags)?;
        let cas = ctx.cas_for(req.new_cas);
        let loc = self.store_item(
            hash,
            key,
            &digits,
            h.flags,
            Expiry::at(h.expiry),
            cas,
            h.ctrl & CTRL_KEY_BINARY,
            now,
        )?;
        self.counters.total_items += 1;
        self.emit_put(loc, ctx);
        Ok(ArithOutcome::Value {
            value: new,
            cas,
            created: false,
        })
    }
}

/// memcached's rule: the value must be a decimal u64, optionally followed by spaces (memcached
/// itself pads shrunk counters with spaces).
/// The number an `incr`/`decr` reads from a stored value, as memcached's `safe_strtoull`
/// does: leading whitespace (`isspace`: space, `\t`, `\n`, `\v`, `\f`, `\r`), an optional
/// sign, at least one decimal digit, and then either the end of the value or whitespace
/// (what follows that is ignored: `"1 2"` reads 1). A `-` is accepted only when the
/// magnitude is 0, since strtoull negates and memcached refuses a result that went negative.
/// A value of whitespace only is not a number: memcached's strtoull then runs past the value
/// into the bytes after it in its slab, which gives no defined answer to copy.
fn parse_counter(value: &[u8]) -> Option<u64> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = value.iter().position(|&b| !is_space(b))?;
    let mut rest = &value[start..];
    let negative = match rest.first() {
        Some(b'-') => {
            rest = &rest[1..];
            true
        }
        Some(b'+') => {
            rest = &rest[1..];
            false
        }
        _ => false,
    };
    let digits_end = rest
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(rest.len());
    if digits_end == 0 || rest.get(digits_end).is_some_and(|&b| !is_space(b)) {
        return None;
    }
    let mut n: u64 = 0;
    for &d in &rest[..digits_end] {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative && n != 0 {
        return None;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::parse_counter;

    #[test]
    fn counter_parsing_follows_memcached() {
        assert_eq!(parse_counter(b"42"), Some(42));
        assert_eq!(parse_counter(b"7  "), Some(7));
        assert_eq!(parse_counter(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_counter(b"18446744073709551616"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"-1"), None);
        assert_eq!(parse_counter(b"12a"), None);
    }

    /// Values memcached 1.6.18 reads as numbers (measured: `set n 0 0 4` `  12`, `incr n 1`
    /// answers 13), and those it calls non-numeric.
    #[test]
    fn counter_parsing_accepts_what_strtoull_accepts() {
        assert_eq!(parse_counter(b"  12"), Some(12));
        assert_eq!(parse_counter(b" 12 "), Some(12));
        assert_eq!(parse_counter(b"\t12"), Some(12));
        assert_eq!(parse_counter(b"+12"), Some(12));
        assert_eq!(parse_counter(b"012"), Some(12));
        assert_eq!(parse_counter(b"1 2"), Some(1));
        assert_eq!(parse_counter(b"-0"), Some(0));
        assert_eq!(parse_counter(b"00000000000000000000012"), Some(12));
        assert_eq!(parse_counter(b"  "), None);
        assert_eq!(parse_counter(b"+"), None);
        assert_eq!(parse_counter(b"-12"), None);
        assert_eq!(parse_counter(b"0x10"), None);
        assert_eq!(parse_counter(b"99999999999999999999"), None);
    }
}
