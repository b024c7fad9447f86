//! Cell ids: exact, totally ordered names for the cells of the ring.
//!
//! The Cell Cycle proposal cellcache started from names cells with floats and places a child
//! between its parent and the parent's successor ("name the child with the next whole number if
//! it fits, else the midpoint"). Floats run out of precision after ~50 divisions at one spot;
//! this module keeps the same rule with exact arithmetic. A [`CellId`] is a non-negative dyadic
//! rational `whole + Σ frac[i] / 256^(i+1)`: midpoints of dyadic rationals are dyadic, so
//! dividing the same spot any number of times always yields a new, distinct, correctly ordered
//! id, at the cost of one bit per division.
//!
//! Guarantees: the representation is canonical (no trailing zero fraction bytes), so derived
//! equality, hashing and ordering are exactly those of the rational values; the text form
//! (`"2.25"`, a finite decimal, which every dyadic rational has) round-trips exactly and is
//! what serde uses; parsing is bounded by [`ID_TEXT_BYTES_MAX`] and never panics.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest text form accepted by [`CellId::from_str`]. A fraction of `n` bits prints as `n`
/// decimal digits, so this admits ids produced by more than 16,000 divisions at one spot —
/// far beyond any real ring — while bounding the work a hostile map update can cause.
pub const ID_TEXT_BYTES_MAX: usize = 16 * 1024;

/// Why a cell id could not be produced or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum IdError {
    /// `between(a, b)` was asked for an interval that is empty (`a >= b`).
    #[error("no id strictly between {low} and {high}: bounds are not increasing")]
    EmptyInterval { low: String, high: String },
    /// The whole part would pass `u64::MAX` (after 2^64 appends at the end of the ring).
    #[error("cell id whole part overflows u64")]
    Overflow,
    /// The text is not a valid id.
    #[error("invalid cell id text: {0}")]
    Parse(String),
}

/// An exact position on the ring of cells. Ordered, hashable, cheap to compare.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellId {
    whole: u64,
    /// Base-256 fraction digits, most significant first; never ends in a zero byte. Because the
    /// form is canonical, the derived lexicographic order of `(whole, frac)` is numeric order.
    frac: Vec<u8>,
}

impl CellId {
    /// The id of a whole number, e.g. the first cell of a ring is `CellId::whole(1)`.
    pub fn whole(n: u64) -> Self {
        CellId {
            whole: n,
            frac: Vec::new(),
        }
    }

    /// The whole part (`floor`).
    pub fn whole_part(&self) -> u64 {
        self.whole
    }

    /// Number of fraction bytes: grows by one every eight divisions at the same spot.
    pub fn fraction_bytes(&self) -> usize {
        self.frac.len()
    }

    /// The naming rule of the module doc in exact arithmetic: the id of a new cell placed
    /// after `low`, before `high` (`None` when `low` is the last id of the ring). If the next
    /// whole number after `low` is still below `high` it is used (keeps ids short); otherwise
    /// the exact midpoint. The result is strictly between the bounds.
    pub fn between(low: &CellId, high: Option<&CellId>) -> Result<CellId, IdError> {
        let next_whole = low.whole.checked_add(1).map(CellId::whole);
        match high {
            None => next_whole.ok_or(IdError::Overflow),
            Some(high) if low >= high => Err(IdError::EmptyInterval {
                low: low.to_string(),
                high: high.to_string(),
            }),
            Some(high) => match next_whole {
                Some(next) if next < *high => Ok(next),
                _ => Ok(midpoint(low, high)),
            },
        }
    }
}

/// `(a + b) / 2`, exact. Callers guarantee `a < b`, so the sum's whole part fits in u128.
fn midpoint(a: &CellId, b: &CellId) -> CellId {
    let len = a.frac.len().max(b.frac.len());
    let mut digits = vec![0u8; len];
    let mut carry = 0u16;
    for i in (0..len).rev() {
        let sum = u16::from(*a.frac.get(i).unwrap_or(&0))
            + u16::from(*b.frac.get(i).unwrap_or(&0))
            + carry;
        digits[i] = (sum & 0xff) as u8;
        carry = sum >> 8;
    }
    let whole_sum = u128::from(a.whole) + u128::from(b.whole) + u128::from(carry);
    // Halve the base-256 number: the remainder of each step flows into the next digit.
    let mut rem = (whole_sum & 1) as u16;
    for d in digits.iter_mut() {
        let cur = (rem << 8) | u16::from(*d);
        *d = (cur >> 1) as u8;
        rem = cur & 1;
    }
    if rem == 1 {
        digits.push(0x80);
    }
    while digits.last() == Some(&0) {
        digits.pop();
    }
    // whole_sum / 2 <= max(a.whole, b.whole) fits in u64 because a < b implies the halved
    // sum is below b.
    let whole = u64::try_from(whole_sum >> 1).unwrap_or(u64::MAX);
    CellId {
        whole,
        frac: digits,
    }
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.whole)?;
        if self.frac.is_empty() {
            return Ok(());
        }
        // Horner's rule from the least significant base-256 digit: v = (digit + v) / 256, with
        // v kept as decimal digits. Dividing by 256 = 2^8 always terminates in decimal.
        let mut dec: Vec<u8> = Vec::new();
        for &byte in self.frac.iter().rev() {
            let mut carry = u32::from(byte);
            for d in dec.iter_mut() {
                let cur = carry * 10 + u32::from(*d);
                *d = (cur / 256) as u8;
                carry = cur % 256;
            }
            while carry != 0 {
                let cur = carry * 10;
                dec.push((cur / 256) as u8);
                carry = cur % 256;
            }
        }
        while dec.last() == Some(&0) {
            dec.pop();
        }
        f.write_str(".")?;
        for d in dec {
            write!(f, "{}", d)?;
        }
        Ok(())
    }
}

impl fmt::Debug for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CellId({self})")
    }
}

impl FromStr for CellId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > ID_TEXT_BYTES_MAX {
            return Err(IdError::Parse("too long".into()));
        }
        let (whole_text, frac_text) = match s.split_once('.') {
            Some((w, f)) => (w, f),
            None => (s, ""),
        };
        if whole_text.is_empty() || !whole_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IdError::Parse("whole part must be decimal digits".into()));
        }
        let whole: u64 = whole_text
            .parse()
            .map_err(|_| IdError::Parse("whole part overflows u64".into()))?;
        if s.contains('.') && frac_text.is_empty() {
            return Err(IdError::Parse("empty fraction".into()));
        }
        if !frac_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IdError::Parse("fraction must be decimal digits".into()));
        }
        let mut dec: Vec<u8> = frac_text.bytes().map(|b| b - b'0').collect();
        if dec.last() == Some(&0) {
            return Err(IdError::Parse(
                "fraction has trailing zeros (not canonical)".into(),
            ));
        }
        // Multiply the decimal fraction by 256 repeatedly; each carry out is one base-256
        // digit. A k-digit dyadic decimal has at most k bits, so k/8 + 1 steps suffice: if
        // anything is left then, the fraction is not dyadic and no CellId has this text.
        let mut frac = Vec::new();
        let steps_max = dec.len() / 8 + 1;
        while dec.iter().any(|&d| d != 0) {
            if frac.len() == steps_max {
                return Err(IdError::Parse("fraction is not a dyadic rational".into()));
            }
            let mut carry = 0u32;
            for d in dec.iter_mut().rev() {
                let cur = u32::from(*d) * 256 + carry;
                *d = (cur % 10) as u8;
                carry = cur / 10;
            }
            frac.push(carry as u8);
        }
        while frac.last() == Some(&0) {
            frac.pop();
        }
        Ok(CellId { whole, frac })
    }
}

impl Serialize for CellId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CellId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(s: &str) -> CellId {
        s.parse().expect("valid id")
    }

    #[test]
    fn child_ids_match_the_proposals_division_examples() {
        // Node 2 (last) divides -> 3; 2 divides again (successor 3) -> 2.5; then 2.25.
        assert_eq!(CellId::between(&id("2"), None).unwrap(), id("3"));
        assert_eq!(
            CellId::between(&id("2"), Some(&id("3"))).unwrap(),
            id("2.5")
        );
        assert_eq!(
            CellId::between(&id("1"), Some(&id("2"))).unwrap(),
            id("1.5")
        );
        assert_eq!(
            CellId::between(&id("2"), Some(&id("2.5"))).unwrap(),
            id("2.25")
        );
        // A whole number in between is preferred over the midpoint.
        assert_eq!(
            CellId::between(&id("3.5"), Some(&id("7"))).unwrap(),
            id("4")
        );
        assert_eq!(
            CellId::between(&id("3.5"), Some(&id("4"))).unwrap(),
            id("3.75")
        );
    }

    #[test]
    fn thousand_successive_divisions_stay_ordered_and_distinct() {
        // Always divide the newest cell towards a fixed successor, and separately always the
        // parent towards the newest child: both shrink the gap by half every step.
        let high = id("2");
        let mut ids = vec![id("1")];
        let mut low = id("1");
        for _ in 0..1000 {
            let child = CellId::between(&low, Some(&high)).unwrap();
            assert!(low < child && child < high);
            ids.push(child.clone());
            low = child;
        }
        let mut hi = id("1.5");
        let lo = id("1");
        for _ in 0..1000 {
            let child = CellId::between(&lo, Some(&hi)).unwrap();
            assert!(lo < child && child < hi);
            ids.push(child.clone());
            hi = child;
        }
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "all ids distinct");
        // One bit per division: 1000 divisions need 125 bytes.
        assert!(low.fraction_bytes() <= 126);
        for i in &ids {
            assert_eq!(
                &i.to_string().parse::<CellId>().unwrap(),
                i,
                "text round trip"
            );
        }
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "",
            ".5",
            "1.",
            "1.50",
            "1.3",
            "-1",
            "1.2a",
            "18446744073709551616",
            "1..5",
        ] {
            assert!(bad.parse::<CellId>().is_err(), "{bad:?} must be refused");
        }
        assert!(CellId::between(&id("2"), Some(&id("2"))).is_err());
        assert_eq!(
            CellId::between(&CellId::whole(u64::MAX), None),
            Err(IdError::Overflow)
        );
    }

    #[test]
    fn serde_uses_decimal_text() {
        let json = serde_json::to_string(&id("2.25")).unwrap();
        assert_eq!(json, "\"2.25\"");
        let back: CellId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id("2.25"));
    }

    fn arb_id() -> impl Strategy<Value = CellId> {
        (0u64..8, proptest::collection::vec(any::<u8>(), 0..6)).prop_map(|(whole, mut frac)| {
            while frac.last() == Some(&0) {
                frac.pop();
            }
            CellId { whole, frac }
        })
    }

    proptest! {
        #[test]
        fn between_is_strictly_between(a in arb_id(), b in arb_id()) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            match CellId::between(&lo, Some(&hi)) {
                Ok(mid) => { prop_assert!(lo < mid && mid < hi); }
                Err(_) => prop_assert_eq!(&lo, &hi),
            }
            let after = CellId::between(&hi, None).unwrap();
            prop_assert!(hi < after);
        }

        #[test]
        fn order_matches_f64_order_where_exact(a in arb_id(), b in arb_id()) {
            // With at most 6 fraction bytes (48 bits) + whole < 8, f64 is exact.
            let fa: f64 = a.to_string().parse().unwrap();
            let fb: f64 = b.to_string().parse().unwrap();
            prop_assert_eq!(a.cmp(&b), fa.partial_cmp(&fb).unwrap());
        }

        #[test]
        fn text_round_trips(a in arb_id()) {
            prop_assert_eq!(a.to_string().parse::<CellId>().unwrap(), a);
        }

        #[test]
        fn parse_never_panics(s in "[0-9.]{0,40}") {
            let _ = s.parse::<CellId>();
        }
    }
}
