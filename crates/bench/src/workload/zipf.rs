//! Zipf-distributed ranks over a finite key space, sampled in O(1) time and memory.
//!
//! The sampling is `rand_distr::Zipf` (rejection sampling against a continuous envelope, due
//! to Jason Crease): no table of `n` probabilities is built, so a key space of a hundred million
//! keys costs nothing to set up, and each sample takes a few uniform draws on average. The
//! result follows `P(rank = k) ∝ k^-s` for `k` in `1..=n` exactly (not an approximation).
//! This wrapper keeps what the workload needs on top: 0-based ranks as `u64`, an exponent
//! that must be finite and `> 0` (rand_distr also takes `s = 0`, the uniform case, which the
//! workload spells `Popularity::Uniform`), and the exact probability of a rank for tests and
//! reports.

use rand::Rng;
use rand::distributions::Distribution;
use thiserror::Error;

/// Why a Zipf sampler could not be built.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ZipfError {
    #[error("Zipf needs at least one element")]
    Empty,
    #[error("Zipf exponent must be finite and > 0, got {0}")]
    BadExponent(f64),
}

/// Samples ranks `0..n` (0 is the most popular) with probability proportional to `(rank+1)^-s`.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    exponent: f64,
    ranks: rand_distr::Zipf<f64>,
}

impl Zipf {
    /// A sampler over `n` ranks with exponent `exponent`.
    pub fn new(n: u64, exponent: f64) -> Result<Self, ZipfError> {
        if n == 0 {
            return Err(ZipfError::Empty);
        }
        if !exponent.is_finite() || exponent <= 0.0 {
            return Err(ZipfError::BadExponent(exponent));
        }
        let ranks = rand_distr::Zipf::new(n, exponent).map_err(|e| match e {
            rand_distr::ZipfError::NTooSmall => ZipfError::Empty,
            rand_distr::ZipfError::STooSmall => ZipfError::BadExponent(exponent),
        })?;
        Ok(Self { n, exponent, ranks })
    }

    /// Number of ranks.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: a sampler has at least one rank.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The exponent `s`.
    pub fn exponent(&self) -> f64 {
        self.exponent
    }

    /// Draws one rank in `0..n`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        // rand_distr returns a whole number in `1..=n` as f64. The clamp is for rounding at the
        // ends: a key space above 2^53 is not exact in f64, and rand_distr has been seen to
        // return `n + 1` for `n = 1` (rust-random/rand_distr#54). The cast saturates.
        let rank = self.ranks.sample(rng) as u64;
        rank.clamp(1, self.n) - 1
    }

    /// The exact probability of rank `rank` (0-based), for tests and reports. O(n).
    pub fn probability(&self, rank: u64) -> f64 {
        let norm: f64 = (1..=self.len())
            .map(|k| (k as f64).powf(-self.exponent))
            .sum();
        ((rank + 1) as f64).powf(-self.exponent) / norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn histogram(n: u64, exponent: f64, draws: u64, seed: u64) -> Vec<u64> {
        let zipf = Zipf::new(n, exponent).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            counts[zipf.sample(&mut rng) as usize] += 1;
        }
        counts
    }

    /// The workload of docs/benchmarks/ratio-size-grid/: 1000 keys, s = 1.345675, "90% of
    /// requests on 10% of keys".
    #[test]
    fn ratio_size_grid_exponent_puts_ninety_percent_on_top_tenth() {
        let draws = 1_000_000;
        let counts = histogram(1000, 1.345675, draws, 42);
        let top: u64 = counts[..100].iter().sum();
        let share = top as f64 / draws as f64;
        assert!((share - 0.9002).abs() < 0.003, "top-10% share {share}");
    }

    #[test]
    fn frequencies_match_the_exponent() {
        for &(n, s) in &[
            (1000u64, 1.345675),
            (1000, 0.99),
            (50, 1.0),
            (200, 0.5),
            (10, 3.0),
        ] {
            let draws = 400_000u64;
            let counts = histogram(n, s, draws, 7);
            let zipf = Zipf::new(n, s).unwrap();
            // Chi-square over ranks with an expected count of at least 20, the rest pooled.
            let mut chi2 = 0.0;
            let mut cells = 0u32;
            let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
            for (rank, &obs) in counts.iter().enumerate() {
                let exp = zipf.probability(rank as u64) * draws as f64;
                if exp >= 20.0 {
                    chi2 += (obs as f64 - exp).powi(2) / exp;
                    cells += 1;
                } else {
                    pooled_obs += obs as f64;
                    pooled_exp += exp;
                }
            }
            if pooled_exp > 0.0 {
                chi2 += (pooled_obs - pooled_exp).powi(2) / pooled_exp;
                cells += 1;
            }
            // For k degrees of freedom the chi-square statistic has mean k and sd sqrt(2k);
            // 6 sd above the mean fails only for a wrong distribution, not for bad luck.
            let dof = f64::from(cells - 1);
            assert!(
                chi2 < dof + 6.0 * (2.0 * dof).sqrt(),
                "n={n} s={s}: chi2 {chi2} over {dof} dof"
            );
            // The slope of log-frequency against log-rank is -s.
            let ratio = counts[0] as f64 / counts[1] as f64;
            assert!(
                (ratio.log2() - s).abs() < 0.05 * s.max(1.0),
                "n={n} s={s}: p1/p2 = {ratio}"
            );
        }
    }

    /// The generalised harmonic number `H(n, s) = Σ k^-s` for `k` in `1..=n`, computed here
    /// rather than through [`Zipf::probability`] so the check does not lean on the code under
    /// test.
    fn harmonic(n: u64, s: f64) -> f64 {
        (1..=n).map(|k| (k as f64).powf(-s)).sum()
    }

    #[test]
    fn rank_one_has_share_one_over_harmonic_and_first_ranks_decrease() {
        let draws = 1_000_000u64;
        for &(n, s) in &[(1000u64, 0.99), (10_000, 1.0), (1000, 1.345675), (100, 2.0)] {
            let counts = histogram(n, s, draws, 11);
            let expected = 1.0 / harmonic(n, s);
            let observed = counts[0] as f64 / draws as f64;
            // The share of rank 1 is binomial; 5 standard deviations off means a wrong
            // distribution (exponent, normalisation or an off-by-one rank), not bad luck.
            let sd = (expected * (1.0 - expected) / draws as f64).sqrt();
            assert!(
                (observed - expected).abs() < 5.0 * sd,
                "n={n} s={s}: rank 1 share {observed}, expected {expected} ± {sd}"
            );
            // Over the first ten ranks neighbours differ by at least 7 standard deviations of
            // their counts for these parameters, so the order is not noise.
            assert!(
                counts[..10].windows(2).all(|w| w[0] >= w[1]),
                "n={n} s={s}: not monotone over the first ranks: {:?}",
                &counts[..10]
            );
        }
    }

    #[test]
    fn equal_seeds_give_equal_ranks() {
        let zipf = Zipf::new(1000, 0.99).unwrap();
        let draw = |seed| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            (0..1000).map(|_| zipf.sample(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn stays_in_range_for_huge_spaces_and_rejects_bad_input() {
        let zipf = Zipf::new(100_000_000, 0.99).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        assert!((0..10_000).all(|_| zipf.sample(&mut rng) < 100_000_000));
        assert_eq!(Zipf::new(1, 2.0).unwrap().sample(&mut rng), 0);
        assert_eq!(Zipf::new(0, 1.0).unwrap_err(), ZipfError::Empty);
        assert!(matches!(Zipf::new(5, 0.0), Err(ZipfError::BadExponent(_))));
        assert!(matches!(
            Zipf::new(5, f64::NAN),
            Err(ZipfError::BadExponent(_))
        ));
    }
}
