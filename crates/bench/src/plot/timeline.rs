//! The per-second charts of `cellcache bench plot`: the p99 and the hit ratio of each second
//! of a report's `results.timeline`, and the marks (`--mark`: a point in time, or a span
//! such as a division) drawn on every timeline chart.

use anyhow::{anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{PARTIAL_BUCKET_MIN, covered};
use crate::report::{RunReport, SecondReport};

/// An event drawn on the timelines, in seconds since the measured phase began.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub label: String,
    pub from: f64,
    /// End of a span; `None` for a point in time.
    pub to: Option<f64>,
}

impl Mark {
    /// Parses `LABEL=SECS` or `LABEL=FROM..TO`.
    pub fn parse(text: &str) -> Result<Mark, String> {
        let (label, when) = text
            .rsplit_once('=')
            .ok_or_else(|| format!("`{text}`: expected LABEL=SECS or LABEL=FROM..TO"))?;
        let secs = |v: &str| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("`{v}` is not a number of seconds"))
        };
        let (from, to) = match when.split_once("..") {
            Some((a, b)) => {
                let (a, b) = (secs(a)?, secs(b)?);
                if b < a {
                    return Err(format!("`{text}`: the span ends before it starts"));
                }
                (a, Some(b))
            }
            None => (secs(when)?, None),
        };
        Ok(Mark {
            label: label.to_owned(),
            from,
            to,
        })
    }
}

/// Per-second points `(second + ½, value)` of a timeline, split into runs of consecutive
/// seconds that have a value (a second without one, e.g. no reply during a stall, breaks
/// the line instead of bridging it). A last second covered less than
/// [`PARTIAL_BUCKET_MIN`] (drain stragglers) is left out.
fn second_runs(
    timeline: &[SecondReport],
    measured_secs: f64,
    value: impl Fn(&SecondReport) -> Option<f64>,
) -> Vec<Vec<(f64, f64)>> {
    let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut current = Vec::new();
    for (i, s) in timeline.iter().enumerate() {
        let kept = covered(i, timeline.len(), measured_secs) >= PARTIAL_BUCKET_MIN;
        match value(s).filter(|_| kept) {
            Some(v) => current.push((s.second as f64 + 0.5, v)),
            None => {
                if !current.is_empty() {
                    runs.push(std::mem::take(&mut current));
                }
            }
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// Draws `marks` on a chart of seconds: spans shaded, points as vertical lines, each in the
/// legend.
pub(super) fn draw_marks<DB: DrawingBackend, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
    marks: &[Mark],
    (y_lo, y_hi): (f64, f64),
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    for (i, mark) in marks.iter().enumerate() {
        let color = MARK_COLORS[i % MARK_COLORS.len()];
        match mark.to {
            Some(to) => {
                let fill = color.mix(0.18).filled();
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(mark.from, y_lo), (to, y_hi)],
                        fill,
                    )))
                    .map_err(err)?
                    .label(mark.label.clone())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], fill));
            }
            None => {
                let stroke = color.stroke_width(2);
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(mark.from, y_lo), (mark.from, y_hi)],
                        stroke,
                    )))
                    .map_err(err)?
                    .label(mark.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], stroke));
            }
        }
    }
    Ok(())
}

/// Colours of marks, apart from the series' palette.
const MARK_COLORS: [RGBColor; 3] = [RGBColor(230, 120, 0), RGBColor(120, 120, 120), MAGENTA];

/// The x axis of the timelines: every report's seconds, and every mark.
pub(super) fn timeline_secs(series: &[(String, RunReport)], marks: &[Mark]) -> f64 {
    let secs = series
        .iter()
        .map(|(_, r)| r.results.timeline_rps.len().max(r.results.timeline.len()))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    marks
        .iter()
        .map(|m| m.to.unwrap_or(m.from))
        .fold(secs, f64::max)
}

/// A series' per-second points, in runs of consecutive seconds (see [`second_runs`]).
type Runs = Vec<Vec<(f64, f64)>>;

/// Every report's per-second `value`, labelled.
fn second_lines(
    series: &[(String, RunReport)],
    value: impl Fn(&SecondReport) -> Option<f64> + Copy,
) -> Vec<(&str, Runs)> {
    series
        .iter()
        .map(|(label, r)| {
            let runs = second_runs(&r.results.timeline, r.results.measured_secs, value);
            (label.as_str(), runs)
        })
        .collect()
}

/// Draws each labelled series' runs as lines of one colour, labelled once, and the legend.
fn draw_runs<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    lines: Vec<(&str, Runs)>,
    legend: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    for (i, (label, runs)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut first = true;
        for run in runs {
            let drawn = chart
                .draw_series(LineSeries::new(run, color.stroke_width(2)))
                .map_err(err)?;
            if std::mem::take(&mut first) {
                drawn.label(label).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(legend)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Whether any series has a second the per-second charts would draw a point for.
pub(super) fn has_second_points(
    series: &[(String, RunReport)],
    value: impl Fn(&SecondReport) -> Option<f64> + Copy,
) -> bool {
    second_lines(series, value)
        .iter()
        .any(|(_, runs)| runs.iter().any(|run| !run.is_empty()))
}

/// The values of every run of `lines`.
fn run_values<'a>(lines: &'a [(&str, Runs)]) -> impl Iterator<Item = f64> + 'a {
    lines
        .iter()
        .flat_map(|(_, runs)| runs.iter().flatten().map(|&(_, y)| y))
}

pub(super) fn draw_p99_timeline<DB: DrawingBackend>(
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
    let lines = second_lines(series, |s| s.p99_us.map(|us| us.max(1.0)));
    let (lo, hi) =
        run_values(&lines).fold((f64::MAX, 0.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if hi <= 0.0 {
        bail!("the reports' timelines hold no latency samples");
    }
    let (y_lo, y_hi) = (lo * 0.8, hi * 1.25);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{title}: p99 latency per second"),
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..timeline_secs(series, marks), (y_lo..y_hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("second of the measured phase")
        .y_desc("p99 of the replies completed in the second (µs, log)")
        .y_label_formatter(&|us| format!("{us:.0}"))
        .draw()
        .map_err(err)?;
    draw_marks(&mut chart, marks, (y_lo, y_hi))?;
    draw_runs(&mut chart, lines, SeriesLabelPosition::UpperLeft)
}

pub(super) fn draw_hit_ratio<DB: DrawingBackend>(
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
    let lines = second_lines(series, |s| s.hit_ratio().map(|h| h * 100.0));
    let lo = run_values(&lines).fold(100.0f64, f64::min);
    // From a round number below the lowest second to 100 %, so small moves stay visible.
    let y_lo = ((lo - 5.0) / 10.0).floor().max(0.0) * 10.0;
    let y_hi = 100.5;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{title}: hit ratio per second"), ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..timeline_secs(series, marks), y_lo..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("second of the measured phase")
        .y_desc("hits / keys looked up (%)")
        .y_label_formatter(&|p| format!("{p:.0}"))
        .draw()
        .map_err(err)?;
    draw_marks(&mut chart, marks, (y_lo, y_hi))?;
    draw_runs(&mut chart, lines, SeriesLabelPosition::LowerRight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::{render, render_marked};

    #[test]
    fn marks_parse_points_and_spans() {
        assert_eq!(
            Mark::parse("third cell started=20.5"),
            Ok(Mark {
                label: "third cell started".into(),
                from: 20.5,
                to: None
            })
        );
        assert_eq!(
            Mark::parse("a=b=1..2.25"),
            Ok(Mark {
                label: "a=b".into(),
                from: 1.0,
                to: Some(2.25)
            })
        );
        for bad in ["no-equals", "x=", "x=abc", "x=3..2", "x=1..", "x=inf"] {
            assert!(Mark::parse(bad).is_err(), "{bad}");
        }
    }

    fn second(second: u64, p99: Option<f64>, hits: u64, misses: u64) -> SecondReport {
        SecondReport {
            second,
            replies: u64::from(p99.is_some()),
            errors: 0,
            hits,
            misses,
            late_sends: 0,
            late_sends_generator: 0,
            p50_us: p99,
            p99_us: p99,
            max_us: p99,
        }
    }

    #[test]
    fn second_runs_break_at_gaps_and_drop_a_drain_sliver() {
        let timeline = [
            second(0, Some(10.0), 1, 0),
            second(1, None, 0, 0),
            second(2, Some(30.0), 0, 1),
            second(3, Some(40.0), 1, 1),
            second(4, Some(99.0), 1, 0),
        ];
        let runs = second_runs(&timeline, 4.05, |s| s.p99_us);
        assert_eq!(
            runs,
            vec![vec![(0.5, 10.0)], vec![(2.5, 30.0), (3.5, 40.0)]],
            "the stalled second breaks the line; the sliver of second 4 is left out"
        );
        let hit = second_runs(&timeline, 5.0, |s| s.hit_ratio());
        assert_eq!(
            hit,
            vec![vec![(0.5, 1.0)], vec![(2.5, 0.0), (3.5, 0.5), (4.5, 1.0)]]
        );
    }

    #[test]
    fn timeline_charts_are_drawn_with_their_marks() {
        let mut report = crate::report::minimal_report(3.0);
        report.results.measured_secs = 3.0;
        report.results.ops.insert(
            "get".into(),
            crate::report::OpReport {
                spectrum: vec![
                    crate::stats::SpectrumPoint {
                        quantile: 0.5,
                        latency_us: 100.0,
                    },
                    crate::stats::SpectrumPoint {
                        quantile: 0.99,
                        latency_us: 2_500.0,
                    },
                ],
                ..Default::default()
            },
        );
        report.results.timeline_rps = vec![100, 90, 100];
        report.results.timeline = vec![
            second(0, Some(100.0), 90, 10),
            second(1, Some(2_500.0), 80, 20),
            second(2, Some(110.0), 95, 5),
        ];
        let dir =
            std::env::temp_dir().join(format!("cellcache-plot-timeline-{}", std::process::id()));
        let marks = [
            Mark::parse("division=0.8..1.6").unwrap(),
            Mark::parse("started=0.5").unwrap(),
        ];
        let written = render_marked(&[("run".into(), report.clone())], &dir, None, "t", &marks)
            .expect("plotting needs a TrueType font: `apt-get install fonts-dejavu-core`");
        assert_eq!(written.len(), 8, "{written:?}");
        let svg = std::fs::read_to_string(dir.join("latency_timeline.svg")).unwrap();
        assert!(svg.contains("p99 latency per second") && svg.contains("division"));
        let svg = std::fs::read_to_string(dir.join("hit_ratio.svg")).unwrap();
        assert!(svg.contains("hit ratio per second") && svg.contains("started"));
        assert!(
            std::fs::read_to_string(dir.join("throughput.svg"))
                .unwrap()
                .contains("division")
        );
        // A report from before the timeline existed gets the two classic charts only.
        report.results.timeline.clear();
        let _ = std::fs::remove_dir_all(&dir);
        let written = render(&[("old".into(), report.clone())], &dir, None, "t").unwrap();
        assert_eq!(written.len(), 4, "{written:?}");
        // A run over in a sliver of its first second has no second to draw (CI saw a 2,000-
        // request comparison do this): the classic charts, no error.
        report.results.measured_secs = 0.05;
        report.results.timeline = vec![second(0, Some(100.0), 90, 10)];
        let _ = std::fs::remove_dir_all(&dir);
        let written = render(&[("short".into(), report)], &dir, None, "t").unwrap();
        assert_eq!(written.len(), 4, "{written:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
