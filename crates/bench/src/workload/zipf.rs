//! Zipf-distributed ranks over a finite key space, sampled in O(1) time and memory.
//!
//! Uses rejection-inversion (Hörmann and Derflinger, "Rejection-inversion to generate variates
//! from monotone discrete distributions", 1996): no table of `n` probabilities is built, so a
//! key space of a hundred million keys costs nothing to set up, and each sample takes on average
//! little more than one uniform draw. The result follows `P(rank = k) ∝ k^-s` for `k` in `1..=n`
//! exactly (not an approximation), for any exponent `s > 0`, including `s = 1`.

use rand::Rng;
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
    n: f64,
    exponent: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
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
        let mut z = Self {
            n: n as f64,
            exponent,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// Number of ranks.
    pub fn len(&self) -> u64 {
        self.n as u64
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
        // Each iteration accepts with probability well above 1/2 for every exponent, so the
        // loop ends quickly; the bound only guards against a broken RNG.
        const ATTEMPTS_MAX: u32 = 1_000;
        for _ in 0..ATTEMPTS_MAX {
            let u =
                self.h_integral_n + rng.r#gen::<f64>() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.s || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64 - 1;
            }
        }
        0
    }

    /// The exact probability of rank `rank` (0-based), for tests and reports. O(n).
    pub fn probability(&self, rank: u64) -> f64 {
        let norm: f64 = (1..=self.len())
            .map(|k| (k as f64).powf(-self.exponent))
            .sum();
        ((rank + 1) as f64).powf(-self.exponent) / norm
    }

    fn h(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.exponent) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.exponent)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// `ln(1+x)/x`, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1)/x`, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
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

    /// Seed 004's workload: 1000 keys, s = 1.345675, "90% of requests on 10% of keys".
    #[test]
    fn seed004_exponent_puts_ninety_percent_on_top_tenth() {
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
