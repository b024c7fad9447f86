//! `cellcache bench hit-ratio-plot`: hit-ratio reports ([`crate::hitratio::HitRatioReport`])
//! as grouped bars — one group per workload (Zipf exponent, working set as a multiple of the
//! server's memory), one bar per server label (in the order first met); workloads without a
//! scan in the upper panel, with one in the lower.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::hitratio::HitRatioReport;

/// `cellcache bench hit-ratio-plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct HitRatioPlotArgs {
    /// A report written by `cellcache bench hit-ratio --output`; repeat for every run.
    #[arg(long = "json", required = true)]
    pub reports: Vec<PathBuf>,
    /// File to write, without extension: FILE.svg and FILE.png.
    #[arg(long)]
    pub out: PathBuf,
    /// TrueType font for the text.
    #[arg(long)]
    pub font: Option<PathBuf>,
    /// Title above the plot.
    #[arg(long, default_value = "hit ratio")]
    pub title: String,
}

/// Image size in pixels.
const SIZE: (u32, u32) = (1400, 1000);

/// A workload: (Zipf exponent, working set over memory), ordered as drawn.
fn workload_of(r: &HitRatioReport) -> (f64, f64) {
    let p = &r.params;
    let working_set = p.keys as f64 * (p.key_len + p.value_len) as f64;
    (
        p.zipf_exponent,
        (working_set / r.limit_bytes.max(1) as f64).round(),
    )
}

/// Group names, server labels, and each (group, label)'s hit ratio in percent.
type Bars = (Vec<String>, Vec<String>, Vec<(usize, usize, f64)>);

/// The bars of the reports with (`scan`) or without a scan; `labels` is shared by both panels.
fn bars(reports: &[HitRatioReport], scan: bool, labels: &[String]) -> Bars {
    let chosen: Vec<&HitRatioReport> = reports
        .iter()
        .filter(|r| (r.params.scan_every > 0) == scan)
        .collect();
    let mut workloads: Vec<(f64, f64)> = chosen.iter().map(|r| workload_of(r)).collect();
    workloads.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    workloads.dedup();
    let groups = workloads
        .iter()
        .map(|(alpha, factor)| format!("α {alpha} · {factor}×"))
        .collect();
    let bars = chosen
        .iter()
        .filter_map(|r| {
            let g = workloads.iter().position(|w| *w == workload_of(r))?;
            let l = labels.iter().position(|l| *l == r.label)?;
            Some((g, l, 100.0 * r.hit_ratio))
        })
        .collect();
    (groups, labels.to_vec(), bars)
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    reports: &[HitRatioReport],
    title: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE)?;
    let mut labels: Vec<String> = Vec::new();
    for r in reports {
        if !labels.contains(&r.label) {
            labels.push(r.label.clone());
        }
    }
    let area = area.titled(title, ("sans-serif", 24))?;
    let panels = area.split_evenly((2, 1));
    for (panel, scan) in panels.iter().zip([false, true]) {
        let name = if scan { "with a scan" } else { "no scan" };
        draw_panel(panel, bars(reports, scan, &labels), name)?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (groups, labels, bars): Bars,
    title: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let n = groups.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..118f64)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                groups.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("hit ratio (%)")
        .label_style(("sans-serif", 14))
        .draw()?;
    let width = 0.8 / labels.len().max(1) as f64;
    for (l, label) in labels.iter().enumerate() {
        let color = Palette99::pick(l).to_rgba();
        let rects = bars.iter().filter(|b| b.1 == l).map(|&(g, _, pct)| {
            let x0 = g as f64 - 0.4 + l as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.9, pct)], color.filled())
        });
        chart
            .draw_series(rects)?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        let values = bars.iter().filter(|b| b.1 == l).map(|&(g, _, pct)| {
            let x = g as f64 - 0.4 + (l as f64 + 0.45) * width;
            let centred = Pos::new(HPos::Center, VPos::Bottom);
            Text::new(
                format!("{pct:.1}"),
                (x, pct + 0.5),
                ("sans-serif", 12).into_font().color(&BLACK).pos(centred),
            )
        });
        chart.draw_series(values)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// Draws `reports` into `out`.svg and `out`.png; returns the files written.
pub fn render(
    reports: &[HitRatioReport],
    out: &Path,
    font: Option<&Path>,
    title: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    if reports.is_empty() {
        bail!("nothing to plot");
    }
    super::ensure_font(font)?;
    let svg = out.with_extension("svg");
    let png = out.with_extension("png");
    {
        let area = SVGBackend::new(&svg, SIZE).into_drawing_area();
        draw(&area, reports, title)?;
        area.present()
            .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
    }
    {
        let area = BitMapBackend::new(&png, SIZE).into_drawing_area();
        draw(&area, reports, title)?;
        area.present()
            .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
    }
    Ok(vec![svg, png])
}

/// Entry point of `cellcache bench hit-ratio-plot`.
pub fn run(args: HitRatioPlotArgs) -> anyhow::Result<()> {
    let reports = args
        .reports
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        })
        .collect::<anyhow::Result<Vec<HitRatioReport>>>()?;
    for file in render(&reports, &args.out, args.font.as_deref(), &args.title)? {
        println!("wrote {}", file.display());
    }
    Ok(())
}
