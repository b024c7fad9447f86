//! `cellcache serve`'s autoscaling flags: the common case of `[autoscale]` on the command
//! line (`--autoscale --provisioner local --high-water 0.8 --low-water 0.3 --scale-window
//! 30s --cooldown 60s`), and what a provisioner tells the cell it starts (`--divide`,
//! `--provisioned`).

use cellcache_node::config::{NodeConfig, ProvisionerKind};

#[derive(clap::Args, Debug, Default)]
pub struct ScaleFlags {
    /// Divide cells short of memory and absorb idle ones by themselves (autoscale.enabled).
    #[arg(long)]
    pub autoscale: bool,
    /// How cells are started and stopped: local, command, docker or kubernetes.
    #[arg(long, value_name = "KIND")]
    pub provisioner: Option<ProvisionerKind>,
    /// Fill of -m at or above which a cell divides (0..1).
    #[arg(long, value_name = "FRACTION")]
    pub high_water: Option<f64>,
    /// Fill of -m below which a provisioned cell is absorbed (0..1).
    #[arg(long, value_name = "FRACTION")]
    pub low_water: Option<f64>,
    /// How long a cell stays beyond a watermark before it counts (e.g. 30s, 500ms, 2m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub scale_window: Option<u64>,
    /// Quiet time after a division or absorption before the next.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub cooldown: Option<u64>,
    /// Fewest cells autoscaling absorbs down to.
    #[arg(long, value_name = "N")]
    pub min_cells: Option<usize>,
    /// Most cells autoscaling divides up to.
    #[arg(long, value_name = "N")]
    pub max_cells: Option<usize>,
    /// With --join: the id of the cell to divide (default: the largest range).
    #[arg(long, value_name = "CELL")]
    pub divide: Option<String>,
    /// This cell was started by a provisioner: autoscaling may absorb it.
    #[arg(long)]
    pub provisioned: bool,
}

/// `30s`, `500ms`, `2m`, `1h`, or plain seconds, in milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 500ms, 2m)"))?;
    let per = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    n.checked_mul(per)
        .ok_or_else(|| format!("{s:?} is too long"))
}

impl ScaleFlags {
    pub fn apply(&self, c: &mut NodeConfig) {
        let a = &mut c.autoscale;
        if self.autoscale {
            a.enabled = true;
        }
        if let Some(p) = self.provisioner {
            a.provisioner = p;
        }
        if let Some(v) = self.high_water {
            a.high_water = v;
        }
        if let Some(v) = self.low_water {
            a.low_water = v;
        }
        if let Some(v) = self.scale_window {
            a.window_ms = v;
        }
        if let Some(v) = self.cooldown {
            a.cooldown_ms = v;
        }
        if let Some(v) = self.min_cells {
            a.min_cells = v;
        }
        if let Some(v) = self.max_cells {
            a.max_cells = v;
        }
        if let Some(d) = &self.divide {
            c.cluster.divide = d.clone();
        }
        if self.provisioned {
            c.cluster.provisioned = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("7"), Ok(7_000));
        assert!(parse_duration_ms("3 days").is_err());
        assert!(parse_duration_ms("s").is_err());
    }
}
