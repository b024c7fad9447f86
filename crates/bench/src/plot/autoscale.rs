//! `cellcache bench plot-autoscale`: a ring's run from one cell to many and back, as one
//! figure of five panels over one shared time axis — the number of cells, each cell's memory
//! fill (lowest, median and highest, with the watermarks), the client's replies per second,
//! its p99 per second and its hit ratio per second — with every division and absorption
//! drawn as a vertical line through all five.
//!
//! Its inputs are the bench's JSON report (`results.timeline`) and a ring file written by
//! whoever sampled the ring (`scripts/bench-autoscale`): [`RingSamples`], times in seconds of
//! the bench's measured phase.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::report::RunReport;

/// `cellcache bench plot-autoscale`.
#[derive(Debug, Clone, clap::Args)]
pub struct AutoscaleArgs {
    /// The bench's JSON report (`cellcache bench --output`).
    #[arg(long = "json")]
    pub report: PathBuf,
    /// The ring's samples and events ([`RingSamples`] as JSON).
    #[arg(long)]
    pub ring: PathBuf,
    /// Directory to write autoscale.{svg,png} into.
    #[arg(long)]
    pub out: PathBuf,
    /// TrueType font for the text.
    #[arg(long)]
    pub font: Option<PathBuf>,
    /// Title above the figure.
    #[arg(long, default_value = "a ring from one cell to N and back")]
    pub title: String,
}

/// What was sampled from the ring, in seconds of the bench's measured phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RingSamples {
    /// The autoscaler's watermarks (drawn on the fill panel).
    pub high_water: Option<f64>,
    pub low_water: Option<f64>,
    pub samples: Vec<RingSample>,
    pub events: Vec<RingEvent>,
}

/// One look at the ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingSample {
    pub t: f64,
    /// Cells in the ring.
    pub cells: u32,
    /// Live bytes over `-m`, of the emptiest, the median and the fullest cell.
    pub fill_min: f64,
    pub fill_median: f64,
    pub fill_max: f64,
}

/// A change of the ring (`division_finished`, `absorption_finished`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingEvent {
    pub t: f64,
    pub kind: String,
}

/// Figure size in pixels: five panels stacked.
const FIGURE_SIZE: (u32, u32) = (1200, 1500);
const DIVISION: RGBColor = RGBColor(0, 140, 60);
const ABSORPTION: RGBColor = RGBColor(200, 30, 30);

/// Entry point of `cellcache bench plot-autoscale`.
pub fn run(args: AutoscaleArgs) -> anyhow::Result<()> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let report: RunReport = serde_json::from_str(&read(&args.report)?)
        .with_context(|| format!("parsing {}", args.report.display()))?;
    let ring: RingSamples = serde_json::from_str(&read(&args.ring)?)
        .with_context(|| format!("parsing {}", args.ring.display()))?;
    for path in render(&report, &ring, &args.out, args.font.as_deref(), &args.title)? {
        println!("{}", path.display());
    }
    Ok(())
}

/// Draws the figure into `out` as autoscale.svg and autoscale.png; returns the files.
pub fn render(
    report: &RunReport,
    ring: &RingSamples,
    out: &Path,
    font: Option<&Path>,
    title: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    if report.results.timeline.is_empty() && ring.samples.is_empty() {
        bail!("nothing to plot: no timeline and no ring samples");
    }
    super::ensure_font(font)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let svg = out.join("autoscale.svg");
    {
        let area = SVGBackend::new(&svg, FIGURE_SIZE).into_drawing_area();
        draw(&area, report, ring, title)?;
        area.present()
            .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
    }
    let png = out.join("autoscale.png");
    {
        let area = BitMapBackend::new(&png, FIGURE_SIZE).into_drawing_area();
        draw(&area, report, ring, title)?;
        area.present()
            .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
    }
    Ok(vec![svg, png])
}

/// Per-second points of the report's timeline, at each second's midpoint, the partial last
/// second left out.
fn per_second(
    report: &RunReport,
    value: impl Fn(&crate::report::SecondReport) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let r = &report.results;
    r.timeline
        .iter()
        .filter(|s| (s.second + 1) as f64 <= r.measured_secs + 1e-9)
        .filter_map(|s| value(s).map(|v| (s.second as f64 + 0.5, v)))
        .collect()
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &RunReport,
    ring: &RingSamples,
    title: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    area.fill(&WHITE).map_err(err)?;
    let area = area.titled(title, ("sans-serif", 28)).map_err(err)?;
    let panels = area.split_evenly((5, 1));
    let secs = ring
        .samples
        .iter()
        .map(|s| s.t)
        .chain([report.results.measured_secs])
        .fold(1.0f64, f64::max);
    let x = 0.0..secs;

    // 1. Cells.
    let cells: Vec<(f64, f64)> = ring
        .samples
        .iter()
        .map(|s| (s.t, f64::from(s.cells)))
        .collect();
    let most = cells.iter().map(|&(_, c)| c).fold(1.0, f64::max);
    let mut chart = panel(&panels[0], x.clone(), 0.0..most * 1.15 + 1.0, "cells")?;
    draw_events(&mut chart, ring, (0.0, most * 1.15 + 1.0), true)?;
    chart
        .draw_series(LineSeries::new(cells, BLUE.stroke_width(2)))
        .map_err(err)?
        .label("cells in the ring")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;

    // 2. Memory fill per cell.
    let mut chart = panel(
        &panels[1],
        x.clone(),
        0.0..100.0,
        "memory fill of a cell (%)",
    )?;
    draw_events(&mut chart, ring, (0.0, 100.0), false)?;
    for (level, label) in [
        (ring.high_water, "high water"),
        (ring.low_water, "low water"),
    ] {
        if let Some(w) = level {
            let style = BLACK.mix(0.5).stroke_width(1);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, w * 100.0), (secs, w * 100.0)],
                    6,
                    4,
                    style,
                ))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
    }
    let fills: [(&str, FillOf, RGBColor); 3] = [
        ("fullest cell", |s| s.fill_max, RED),
        ("median cell", |s| s.fill_median, BLACK),
        ("emptiest cell", |s| s.fill_min, BLUE),
    ];
    for (label, f, color) in fills {
        let points: Vec<(f64, f64)> = ring.samples.iter().map(|s| (s.t, f(s) * 100.0)).collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;

    // 3. Replies per second.
    let ops = per_second(report, |s| Some(s.replies as f64));
    let peak = ops.iter().map(|&(_, v)| v).fold(1.0, f64::max) * 1.15;
    let mut chart = panel(&panels[2], x.clone(), 0.0..peak, "client replies / s")?;
    draw_events(&mut chart, ring, (0.0, peak), false)?;
    draw_line(&mut chart, ops, BLUE)?;

    // 4. p99 per second, log scale.
    let p99 = per_second(report, |s| s.p99_us.map(|us| us.max(1.0) / 1000.0));
    let (lo, hi) = p99.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &(_, y)| {
        (lo.min(y), hi.max(y))
    });
    let (lo, hi) = if hi > 0.0 {
        (lo * 0.8, hi * 1.25)
    } else {
        (0.01, 1.0)
    };
    let mut chart = ChartBuilder::on(&panels[3])
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(x.clone(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .y_desc("client p99 per second (ms, log)")
        .y_label_formatter(&|ms| format!("{ms}"))
        .draw()
        .map_err(err)?;
    draw_events(&mut chart, ring, (lo, hi), false)?;
    draw_line(&mut chart, p99, BLUE)?;

    // 5. Hit ratio per second.
    let hits = per_second(report, |s| s.hit_ratio().map(|h| h * 100.0));
    let low = hits.iter().map(|&(_, y)| y).fold(100.0f64, f64::min);
    let y_lo = ((low - 1.0).floor()).clamp(0.0, 99.0);
    let mut chart = ChartBuilder::on(&panels[4])
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y_lo..100.2)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_desc("second of the measured phase")
        .y_desc("hit ratio per second (%)")
        .draw()
        .map_err(err)?;
    draw_events(&mut chart, ring, (y_lo, 100.2), false)?;
    draw_line(&mut chart, hits, BLUE)?;
    Ok(())
}

/// Which fill of a sample a line draws.
type FillOf = fn(&RingSample) -> f64;

type Chart<'a, DB, Y> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>;

/// A linear panel over `x` and `y`.
fn panel<'a, DB: DrawingBackend + 'a>(
    area: &'a DrawingArea<DB, Shift>,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    y_desc: &str,
) -> anyhow::Result<Chart<'a, DB, RangedCoordf64>>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

fn draw_line<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'a, DB, Y>,
    points: Vec<(f64, f64)>,
    color: RGBColor,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))
        .map_err(|e| anyhow!("drawing: {e:?}"))?;
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'a, DB, Y>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(|e| anyhow!("drawing: {e:?}"))
}

/// Divisions (finished) and absorptions (finished) as vertical lines; `labelled` puts the
/// two kinds in the panel's legend.
fn draw_events<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'a, DB, Y>,
    ring: &RingSamples,
    (lo, hi): (f64, f64),
    labelled: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    for (kind, color, label) in [
        ("division_finished", DIVISION, "division finished"),
        ("absorption_finished", ABSORPTION, "absorption finished"),
    ] {
        let style = color.mix(0.45).stroke_width(1);
        let lines = ring
            .events
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| PathElement::new(vec![(e.t, lo), (e.t, hi)], style));
        let drawn = chart.draw_series(lines).map_err(err)?;
        if labelled {
            drawn.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_the_five_panels_from_a_report_and_ring_samples() {
        let mut report = crate::report::minimal_report(5.0);
        report.results.measured_secs = 5.0;
        report.results.timeline = (0..5)
            .map(|i| crate::report::SecondReport {
                second: i,
                replies: 100 + i,
                errors: 0,
                hits: 90,
                misses: i,
                late_sends: 0,
                late_sends_generator: 0,
                p50_us: Some(100.0),
                p99_us: Some(1_000.0 * (i + 1) as f64),
                max_us: Some(9_000.0),
            })
            .collect();
        let ring = RingSamples {
            high_water: Some(0.75),
            low_water: Some(0.3),
            samples: (0..6)
                .map(|i| RingSample {
                    t: i as f64,
                    cells: 1 + i % 3,
                    fill_min: 0.1,
                    fill_median: 0.4,
                    fill_max: 0.7,
                })
                .collect(),
            events: vec![
                RingEvent {
                    t: 1.5,
                    kind: "division_finished".into(),
                },
                RingEvent {
                    t: 4.2,
                    kind: "absorption_finished".into(),
                },
            ],
        };
        let json = serde_json::to_string(&ring).unwrap();
        assert_eq!(serde_json::from_str::<RingSamples>(&json).unwrap(), ring);
        let dir = std::env::temp_dir().join(format!("autoscale-plot-{}", std::process::id()));
        let written = render(&report, &ring, &dir, None, "test").unwrap();
        assert_eq!(written.len(), 2);
        for path in &written {
            assert!(
                std::fs::metadata(path).unwrap().len() > 1000,
                "{}",
                path.display()
            );
        }
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.contains("division finished") && svg.contains("hit ratio per second"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
