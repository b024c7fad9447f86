//! What the load generator asks for: which operation, which keys, how large a value.
//!
//! A [`Workload`] is the immutable description (key space, popularity, get ratio, multi-get
//! batch, value sizes, TTL, and optionally a data set that grows and shrinks,
//! [`growth::Growth`]); a [`RequestGen`] is one thread's seeded stream of requests drawn
//! from it. The pieces ([`zipf::Zipf`], [`keys::KeySpace`], [`values::ValueSize`]) are public so
//! other benchmarks (the store's) can draw the same workloads without the network.

pub mod growth;
pub mod keys;
pub mod values;
pub mod zipf;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use keys::KeySpace;
use values::{ValuePool, ValueSize};
use zipf::Zipf;

/// How keys are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Popularity {
    /// Every key equally likely.
    Uniform,
    /// Key of rank `k` (key index `k-1`) with probability ∝ `k^-exponent`.
    Zipf { exponent: f64 },
}

/// The kind of a request, used to keep statistics apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `get` with one or more keys.
    Get,
    /// `set`.
    Set,
    /// `delete` (only a growing data set's shrink sends it, [`growth`]).
    Delete,
}

impl OpKind {
    /// Every kind, in report order.
    pub const ALL: [OpKind; 3] = [OpKind::Get, OpKind::Set, OpKind::Delete];

    /// Lower-case name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Set => "set",
            OpKind::Delete => "delete",
        }
    }
}

/// A complete workload description.
#[derive(Debug, Clone)]
pub struct Workload {
    pub keys: KeySpace,
    pub popularity: Popularity,
    /// Fraction of requests that are gets, in `0..=1`.
    pub get_ratio: f64,
    /// Keys per get request (1 = plain get).
    pub multiget: usize,
    pub value_size: ValueSize,
    /// TTL of every set; 0 = never expires.
    pub ttl_secs: i64,
    /// A data set that grows, holds and shrinks instead of a fixed one (`--grow`): writes
    /// follow the plan, gets read live keys uniformly (the popularity is not used).
    pub growth: Option<growth::Growth>,
}

/// One request as the stream plans it: the keys of a get are drawn while it is written
/// ([`RequestGen::next_key`]), a write's key comes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planned {
    Get,
    Set(u64),
    Delete(u64),
}

/// One thread's request stream. Cheap to create; holds a shared value pool.
#[derive(Debug, Clone)]
pub struct RequestGen {
    workload: Arc<Workload>,
    zipf: Option<Zipf>,
    rng: SmallRng,
    pool: Arc<ValuePool>,
    growth: Option<growth::GrowthState>,
}

impl RequestGen {
    /// A stream seeded with `seed`; equal seeds give equal streams.
    pub fn new(
        workload: Arc<Workload>,
        pool: Arc<ValuePool>,
        seed: u64,
    ) -> Result<Self, zipf::ZipfError> {
        let zipf = match workload.popularity {
            Popularity::Uniform => None,
            Popularity::Zipf { exponent } => Some(Zipf::new(workload.keys.count(), exponent)?),
        };
        Ok(Self {
            workload,
            zipf,
            rng: SmallRng::seed_from_u64(seed),
            pool,
            growth: None,
        })
    }

    /// This stream as thread `thread` of `threads` (a growing data set gives each thread its
    /// share of the keys); `measure_start_ns` is when measurement begins on the run's clock.
    pub fn for_thread(mut self, thread: usize, threads: usize, measure_start_ns: u64) -> Self {
        self.growth = self.workload.growth.map(|plan| {
            growth::GrowthState::new(
                plan,
                self.workload.keys.count(),
                thread,
                threads,
                measure_start_ns,
            )
        });
        self
    }

    /// The next request, due at `now_ns` on the run's clock (a growing data set's writes
    /// depend on it).
    pub fn next_at(&mut self, now_ns: u64) -> Planned {
        if self.next_op() == OpKind::Get {
            return Planned::Get;
        }
        match &mut self.growth {
            Some(g) => match g.write(now_ns, &mut self.rng) {
                growth::Write::Set(key) => Planned::Set(key),
                growth::Write::Delete(key) => Planned::Delete(key),
            },
            None => Planned::Set(self.next_key()),
        }
    }

    /// Request `op` of `key` was answered or failed (a growing data set reads only keys
    /// whose set was answered, and none whose delete was sent).
    pub fn settled(&mut self, op: OpKind, key: u64) {
        if let Some(g) = &mut self.growth {
            g.settled(op, key);
        }
    }

    /// The workload this stream draws from.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The next operation kind.
    pub fn next_op(&mut self) -> OpKind {
        if self.rng.r#gen::<f64>() < self.workload.get_ratio {
            OpKind::Get
        } else {
            OpKind::Set
        }
    }

    /// The next key index to read, following the popularity distribution (a growing data
    /// set's: a live key, uniformly).
    pub fn next_key(&mut self) -> u64 {
        if let Some(g) = &mut self.growth {
            return g.read(&mut self.rng);
        }
        match &self.zipf {
            Some(z) => z.sample(&mut self.rng),
            None => self.rng.gen_range(0..self.workload.keys.count()),
        }
    }

    /// The next value length, drawn from the size distribution.
    pub fn next_value_len(&mut self) -> usize {
        self.workload.value_size.sample(&mut self.rng)
    }

    /// The shared value bytes; a value of length `n` is `pool().value(n)`.
    pub fn pool(&self) -> &ValuePool {
        &self.pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_ratio_and_determinism() {
        let workload = Arc::new(Workload {
            keys: KeySpace::new("k", 1000, None).unwrap(),
            popularity: Popularity::Zipf { exponent: 1.0 },
            get_ratio: 0.9,
            multiget: 1,
            value_size: ValueSize::Fixed(10),
            ttl_secs: 0,
            growth: None,
        });
        let pool = Arc::new(ValuePool::new(10, &mut SmallRng::seed_from_u64(0)));
        let mut a = RequestGen::new(workload.clone(), pool.clone(), 9).unwrap();
        let mut b = RequestGen::new(workload, pool, 9).unwrap();
        let gets = (0..10_000).filter(|_| a.next_op() == OpKind::Get).count();
        assert!((8_800..9_200).contains(&gets), "{gets}");
        let _ = (0..10_000).map(|_| b.next_op()).count();
        assert_eq!(
            (0..100).map(|_| a.next_key()).collect::<Vec<_>>(),
            (0..100).map(|_| b.next_key()).collect::<Vec<_>>()
        );
        let len = a.next_value_len();
        assert_eq!(a.pool().value(len).len(), 10);
    }
}
