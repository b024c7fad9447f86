//! Value sizes and value bytes.
//!
//! A [`ValueSize`] is fixed (`100`), uniform over a range (`64..1024`, both ends included) or a
//! weighted mix (`100:9,8192:1` = 90 % 100-byte and 10 % 8 KiB values). It parses from and
//! prints to that same text, so the JSON report can echo what was asked. Value bytes are slices
//! of one [`ValuePool`] filled once with pseudo-random letters, so generating a value costs
//! nothing and servers that compress see incompressible data.

use rand::Rng;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Why a value-size specification did not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("bad value size {spec:?}: {reason} (use 100, 64..1024 or 100:9,8192:1)")]
pub struct ValueSizeError {
    spec: String,
    reason: &'static str,
}

/// A distribution of value lengths in bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueSize {
    /// Every value has this length.
    Fixed(usize),
    /// Uniform over `min..=max`.
    Uniform { min: usize, max: usize },
    /// Each `(length, weight)` is chosen with probability `weight / sum(weights)`.
    Weighted(Vec<(usize, f64)>),
}

impl ValueSize {
    /// Draws one length.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        match self {
            ValueSize::Fixed(n) => *n,
            ValueSize::Uniform { min, max } => rng.gen_range(*min..=*max),
            ValueSize::Weighted(choices) => {
                let total: f64 = choices.iter().map(|(_, w)| w).sum();
                let mut pick = rng.r#gen::<f64>() * total;
                for &(len, weight) in choices {
                    if pick < weight {
                        return len;
                    }
                    pick -= weight;
                }
                choices.last().map_or(0, |&(len, _)| len)
            }
        }
    }

    /// The largest length this distribution can produce.
    pub fn max(&self) -> usize {
        match self {
            ValueSize::Fixed(n) => *n,
            ValueSize::Uniform { max, .. } => *max,
            ValueSize::Weighted(choices) => choices.iter().map(|&(len, _)| len).max().unwrap_or(0),
        }
    }

    /// The mean length.
    pub fn mean(&self) -> f64 {
        match self {
            ValueSize::Fixed(n) => *n as f64,
            ValueSize::Uniform { min, max } => (*min + *max) as f64 / 2.0,
            ValueSize::Weighted(choices) => {
                let total: f64 = choices.iter().map(|(_, w)| w).sum();
                choices.iter().map(|&(len, w)| len as f64 * w).sum::<f64>() / total
            }
        }
    }
}

impl FromStr for ValueSize {
    type Err = ValueSizeError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |reason| ValueSizeError {
            spec: spec.to_owned(),
            reason,
        };
        let len = |s: &str| parse_bytes(s.trim()).ok_or(err("not a byte count"));
        if let Some((min, max)) = spec.split_once("..") {
            let (min, max) = (len(min)?, len(max)?);
            if min > max {
                return Err(err("range minimum above maximum"));
            }
            return Ok(ValueSize::Uniform { min, max });
        }
        if spec.contains(':') {
            let mut choices = Vec::new();
            for part in spec.split(',') {
                let (l, w) = part
                    .split_once(':')
                    .ok_or(err("each choice is LEN:WEIGHT"))?;
                let weight: f64 = w
                    .trim()
                    .parse()
                    .map_err(|_| err("weight is not a number"))?;
                if !weight.is_finite() || weight <= 0.0 {
                    return Err(err("weights must be > 0"));
                }
                choices.push((len(l)?, weight));
            }
            return Ok(ValueSize::Weighted(choices));
        }
        Ok(ValueSize::Fixed(len(spec)?))
    }
}

/// Parses `100`, `1k`/`1KB`/`1KiB` (1024) or `1m`/`1MB`/`1MiB`.
fn parse_bytes(s: &str) -> Option<usize> {
    let lower = s.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(digits_end);
    let n: usize = num.parse().ok()?;
    let scale = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(scale)
}

impl fmt::Display for ValueSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueSize::Fixed(n) => write!(f, "{n}"),
            ValueSize::Uniform { min, max } => write!(f, "{min}..{max}"),
            ValueSize::Weighted(choices) => {
                for (i, (len, w)) in choices.iter().enumerate() {
                    write!(f, "{}{len}:{w}", if i == 0 { "" } else { "," })?;
                }
                Ok(())
            }
        }
    }
}

/// A block of value bytes; a value of length `n` is the first `n` bytes.
#[derive(Debug, Clone)]
pub struct ValuePool {
    bytes: Vec<u8>,
}

impl ValuePool {
    /// A pool able to serve values up to `max_len` bytes.
    pub fn new<R: Rng + ?Sized>(max_len: usize, rng: &mut R) -> Self {
        let bytes = (0..max_len).map(|_| rng.gen_range(b'a'..=b'z')).collect();
        Self { bytes }
    }

    /// A value of `len` bytes (clamped to the pool size).
    pub fn value(&self, len: usize) -> &[u8] {
        &self.bytes[..len.min(self.bytes.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parses_and_prints_every_form() {
        assert_eq!("100".parse(), Ok(ValueSize::Fixed(100)));
        assert_eq!("1KB".parse(), Ok(ValueSize::Fixed(1024)));
        assert_eq!("8k".parse(), Ok(ValueSize::Fixed(8192)));
        assert_eq!(
            "64..1024".parse(),
            Ok(ValueSize::Uniform { min: 64, max: 1024 })
        );
        let mix: ValueSize = "100:9,8192:1".parse().unwrap();
        assert_eq!(mix, ValueSize::Weighted(vec![(100, 9.0), (8192, 1.0)]));
        assert_eq!(mix.to_string().parse::<ValueSize>(), Ok(mix.clone()));
        assert_eq!(mix.max(), 8192);
        assert!((mix.mean() - 909.2).abs() < 1e-9);
        for bad in ["", "x", "10..5", "1:0", "1:a", "5q"] {
            assert!(
                bad.parse::<ValueSize>().is_err(),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn samples_follow_the_distribution() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mix: ValueSize = "100:9,8192:1".parse().unwrap();
        let draws = 100_000;
        let big = (0..draws).filter(|_| mix.sample(&mut rng) == 8192).count();
        assert!((big as f64 / draws as f64 - 0.1).abs() < 0.01, "{big}");
        let uni = ValueSize::Uniform { min: 10, max: 12 };
        let seen: std::collections::BTreeSet<_> = (0..1000).map(|_| uni.sample(&mut rng)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![10, 11, 12]);
        let pool = ValuePool::new(16, &mut rng);
        assert_eq!(pool.value(5).len(), 5);
        assert_eq!(pool.value(99).len(), 16);
    }
}
