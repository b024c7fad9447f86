//! Plots drawn from the tool's own JSON reports: a latency percentile spectrum and a
//! throughput timeline, each as SVG and PNG; for reports with a per-second timeline
//! (`results.timeline`) also the p99 latency and the hit ratio second by second.
//! `--mark` draws events (a point in time, or a span such as a division) on the timelines.
//!
//! Several reports can be drawn on the same axes (e.g. memcached and cellcache, or the three
//! get ratios of a grid cell); each series is labelled with the report's label (its file stem
//! unless given). The percentile axis is in "nines" (x = -log10(1 - q)), the usual HDR view, so
//! p50, p90, p99, p99.9 are evenly spaced and the tail is visible. Text needs a TrueType font:
//! `--font`, or the first of [`FONT_CANDIDATES`] that exists.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::RunReport;

pub mod autoscale;
pub mod hit_ratio;
mod timeline;
pub use timeline::Mark;
use timeline::{draw_hit_ratio, draw_marks, draw_p99_timeline, has_second_points, timeline_secs};

/// Fonts tried, in order, when `--font` is not given (Debian: fonts-dejavu-core).
pub const FONT_CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Image size in pixels.
const PLOT_SIZE: (u32, u32) = (1000, 600);
/// Highest quantile drawn in nines (five nines).
const NINES_MAX: f64 = 5.0;

/// `cellcache bench plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// A JSON report written by `cellcache bench --json`/`--output` (or by `bench compare`,
    /// whose load runs are drawn one series each); repeat to overlay runs.
    /// `LABEL=PATH` sets the series label (default: the file stem).
    #[arg(long = "json", required = true)]
    pub reports: Vec<String>,
    /// Directory to write latency.{svg,png} and throughput.{svg,png} into.
    #[arg(long)]
    pub out: PathBuf,
    /// TrueType font for the text.
    #[arg(long)]
    pub font: Option<PathBuf>,
    /// Title above the plots.
    #[arg(long, default_value = "cellcache bench")]
    pub title: String,
    /// An event to draw on the timelines: `LABEL=SECS` (a vertical line) or
    /// `LABEL=FROM..TO` (a shaded span), in seconds of the measured phase; repeatable.
    #[arg(long = "mark", value_parser = Mark::parse)]
    pub marks: Vec<Mark>,
}

/// Entry point of `cellcache bench plot`.
pub fn run(args: PlotArgs) -> anyhow::Result<()> {
    let mut series = Vec::new();
    for spec in &args.reports {
        let (label, path) = match spec.split_once('=') {
            Some((label, path)) => (label.to_owned(), PathBuf::from(path)),
            None => {
                let path = PathBuf::from(spec);
                let stem = path
                    .file_stem()
                    .map_or_else(|| spec.clone(), |s| s.to_string_lossy().into_owned());
                (stem, path)
            }
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        series.extend(
            parse_reports(&label, &text).with_context(|| format!("parsing {}", path.display()))?,
        );
    }
    let written = render_marked(
        &series,
        &args.out,
        args.font.as_deref(),
        &args.title,
        &args.marks,
    )?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

/// The run reports in one JSON file: a `bench` report, or every load run of a `bench compare`
/// report (labelled `<side> #<repetition>`).
fn parse_reports(label: &str, text: &str) -> anyhow::Result<Vec<(String, RunReport)>> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    if value.get("schema").and_then(|s| s.as_str()) == Some(crate::compare::COMPARE_SCHEMA) {
        let compare: crate::compare::CompareReport = serde_json::from_value(value)?;
        let runs: Vec<(String, RunReport)> = compare
            .runs
            .into_iter()
            .filter_map(|run| match run.result {
                crate::compare::SideResult::Load(report) => {
                    Some((format!("{} #{}", run.side, run.repetition + 1), *report))
                }
                crate::compare::SideResult::Capacity(_) => None,
            })
            .collect();
        if runs.is_empty() {
            bail!("{label}: a capacity comparison has no latency or throughput to plot");
        }
        return Ok(runs);
    }
    Ok(vec![(label.to_owned(), serde_json::from_value(value)?)])
}

/// Registers the font once per process; plotters keeps a global font table.
fn ensure_font(font: Option<&Path>) -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let outcome = REGISTERED.get_or_init(|| {
        let path = match font {
            Some(p) => p.to_path_buf(),
            None => FONT_CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
                .ok_or_else(|| format!("no font found (tried {FONT_CANDIDATES:?}); install fonts-dejavu-core or pass --font"))?,
        };
        let bytes = std::fs::read(&path).map_err(|e| format!("reading font {}: {e}", path.display()))?;
        // plotters' font table wants 'static bytes; the font lives for the whole process anyway.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
    });
    outcome.clone().map_err(|e| anyhow!(e))
}

/// Draws the plots for `series` into `out` as SVG and PNG; returns the files written.
pub fn render(
    series: &[(String, RunReport)],
    out: &Path,
    font: Option<&Path>,
    title: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    render_marked(series, out, font, title, &[])
}

/// [`render`] with `marks` drawn on the timelines: `latency` and `throughput` always, and
/// `latency_timeline` (p99 per second) and `hit_ratio` (per second) when a report has a
/// per-second timeline (`hit_ratio` only when some get looked a key up).
pub fn render_marked(
    series: &[(String, RunReport)],
    out: &Path,
    font: Option<&Path>,
    title: &str,
    marks: &[Mark],
) -> anyhow::Result<Vec<PathBuf>> {
    if series.is_empty() {
        bail!("nothing to plot");
    }
    ensure_font(font)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut names = vec![Chart::Latency, Chart::Throughput];
    // A run shorter than a drawable second (only a sliver of one) has no per-second chart.
    if has_second_points(series, |s| s.p99_us) {
        names.push(Chart::LatencyTimeline);
        if has_second_points(series, |s| s.hit_ratio()) {
            names.push(Chart::HitRatio);
        }
    }
    let mut written = Vec::new();
    for chart in names {
        let name = chart.file_stem();
        let svg = out.join(format!("{name}.svg"));
        {
            let area = SVGBackend::new(&svg, PLOT_SIZE).into_drawing_area();
            draw_chart(chart, &area, series, title, marks)?;
            area.present()
                .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
        }
        written.push(svg);
        let png = out.join(format!("{name}.png"));
        {
            let area = BitMapBackend::new(&png, PLOT_SIZE).into_drawing_area();
            draw_chart(chart, &area, series, title, marks)?;
            area.present()
                .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
        }
        written.push(png);
    }
    Ok(written)
}

/// The charts `render_marked` draws.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Chart {
    Latency,
    Throughput,
    LatencyTimeline,
    HitRatio,
}

impl Chart {
    fn file_stem(self) -> &'static str {
        match self {
            Chart::Latency => "latency",
            Chart::Throughput => "throughput",
            Chart::LatencyTimeline => "latency_timeline",
            Chart::HitRatio => "hit_ratio",
        }
    }
}

fn draw_chart<DB: DrawingBackend>(
    chart: Chart,
    area: &DrawingArea<DB, Shift>,
    series: &[(String, RunReport)],
    title: &str,
    marks: &[Mark],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    match chart {
        Chart::Latency => draw_latency(area, series, title),
        Chart::Throughput => draw_throughput(area, series, title, marks),
        Chart::LatencyTimeline => draw_p99_timeline(area, series, title, marks),
        Chart::HitRatio => draw_hit_ratio(area, series, title, marks),
    }
}

/// How much of second `second` the measured phase covered: 1 for every second but the last
/// of a timeline of `len` seconds, whose share is what `measured_secs` reaches into it.
fn covered(second: usize, len: usize, measured_secs: f64) -> f64 {
    if second + 1 == len {
        (measured_secs - second as f64).clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// Throughput points, one per second at its midpoint. The last second is usually partial (the
/// run ends inside it): its count is scaled to a rate over the part the run covered, and a
/// sliver under [`PARTIAL_BUCKET_MIN`] of a second (drain stragglers) is left out rather than
/// drawn as a collapse to zero.
fn timeline_points(timeline: &[u64], measured_secs: f64) -> Vec<(f64, f64)> {
    timeline
        .iter()
        .enumerate()
        .filter_map(|(second, &count)| {
            let covered = covered(second, timeline.len(), measured_secs);
            (covered >= PARTIAL_BUCKET_MIN)
                .then(|| (second as f64 + covered / 2.0, count as f64 / covered))
        })
        .collect()
}

/// Shortest partial last second drawn in a throughput plot.
const PARTIAL_BUCKET_MIN: f64 = 0.1;

fn nines(quantile: f64) -> f64 {
    if quantile >= 1.0 {
        NINES_MAX
    } else {
        (-(1.0 - quantile).log10()).min(NINES_MAX)
    }
}

fn draw_latency<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[(String, RunReport)],
    title: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    area.fill(&WHITE).map_err(err)?;
    let mut lines = Vec::new();
    for (label, report) in series {
        for (op, stats) in &report.results.ops {
            let points: Vec<(f64, f64)> = stats
                .spectrum
                .iter()
                .map(|p| (nines(p.quantile), p.latency_us.max(0.001)))
                .collect();
            if !points.is_empty() {
                lines.push((format!("{label} {op}"), points));
            }
        }
    }
    if lines.is_empty() {
        bail!("the reports hold no latency samples");
    }
    let (lo, hi) = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold((f64::MAX, 0.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{title}: latency by percentile"),
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..NINES_MAX, ((lo * 0.8)..(hi * 1.25)).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (µs, log)")
        .y_label_formatter(&|us| {
            if *us >= 1.0 {
                format!("{us:.0}")
            } else {
                format!("{us:.2}")
            }
        })
        .x_labels(6)
        .x_label_formatter(&|x| match x.round() as i64 {
            0 => "p0".into(),
            1 => "p90".into(),
            2 => "p99".into(),
            3 => "p99.9".into(),
            4 => "p99.99".into(),
            _ => "p99.999".into(),
        })
        .draw()
        .map_err(err)?;
    for (i, (label, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw_throughput<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[(String, RunReport)],
    title: &str,
    marks: &[Mark],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    area.fill(&WHITE).map_err(err)?;
    let secs = timeline_secs(series, marks);
    let peak = series
        .iter()
        .flat_map(|(_, r)| r.results.timeline_rps.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{title}: throughput"), ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..secs, 0.0..peak as f64 * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("second of the measured phase")
        .y_desc("replies / s")
        .y_label_formatter(&|rps| format!("{rps:.0}"))
        .draw()
        .map_err(err)?;
    draw_marks(&mut chart, marks, (0.0, peak as f64 * 1.15))?;
    for (i, (label, report)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = timeline_points(&report.results.timeline_rps, report.results.measured_secs);
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_last_second_is_scaled_or_dropped() {
        // 3 full seconds and a drain sliver: the sliver is not drawn.
        assert_eq!(
            timeline_points(&[10, 20, 30, 2], 3.001),
            vec![(0.5, 10.0), (1.5, 20.0), (2.5, 30.0)]
        );
        // A request-count run that ended 0.5 s into its second second: scaled to a rate.
        assert_eq!(
            timeline_points(&[100, 40], 1.5),
            vec![(0.5, 100.0), (1.25, 80.0)]
        );
        assert!(timeline_points(&[], 0.0).is_empty());
        assert!((nines(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(nines(1.0), NINES_MAX);
    }
}
