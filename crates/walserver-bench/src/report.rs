//! What a bench run reports: latency percentiles from an HDR histogram, a time series sampled
//! every 100 ms, the live progress bar, and the SVG plot.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// How often the sampler records a point of the time series (and redraws the bar).
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// A latency histogram in microseconds, 1 µs to 10 minutes at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Records one latency; values past the top are clamped rather than lost.
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, h.high());
    h.record(us).expect("clamped into range");
}

/// The percentiles people ask for, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// One point of the time series.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t: f64,
    /// Rate over the interval ending at `t`.
    pub appends_per_s: f64,
    pub mb_per_s: f64,
    /// Latency of the appends that completed in the interval (0 when none did).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The largest replication lag over the standbys: WAL the primary has flushed that the
    /// standby has not confirmed flushed, in bytes, and PostgreSQL's flush_lag in ms.
    pub lag_bytes: Option<u64>,
    pub flush_lag_ms: Option<f64>,
}

/// The bar drawn on standard error while a load runs; hidden when that is not a terminal
/// or when `quiet` (JSON output) asks for silence.
pub fn progress_bar(len: u64, unit: &str, quiet: bool) -> ProgressBar {
    let target = if quiet || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    let template = format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}}");
    bar.set_style(
        ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Formats a byte count for people: `1.5 GiB`.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// One line of a plot: a name and its points.
pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a plot.
pub struct Panel<'a> {
    pub title: &'a str,
    pub y_label: &'a str,
    pub series: Vec<Series<'a>>,
}

/// Writes panels stacked vertically, each a line chart over time in seconds, as SVG.
pub fn plot_svg(path: &Path, title: &str, panels: &[Panel<'_>]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let height = 320 * panels.len().max(1) as u32 + 40;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let all = panel.series.iter().flat_map(|s| s.points.iter());
        let x_max = all.clone().map(|p| p.0).fold(0.0f64, f64::max).max(0.1);
        let y_max = all.map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(panel.y_label)
            .draw()?;
        for (i, s) in panel.series.iter().enumerate() {
            let color = colors[i % colors.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), &color))?
                .label(s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        if panel.series.len() > 1 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut h = latency_histogram();
        for us in 1..=1000u64 {
            record(&mut h, Duration::from_micros(us));
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 1000);
        assert!((p.p50_ms - 0.5).abs() < 0.01, "{p:?}");
        assert!((p.p99_ms - 0.99).abs() < 0.01, "{p:?}");
        assert!((p.max_ms - 1.0).abs() < 0.01, "{p:?}");
        assert!(p.p50_ms <= p.p90_ms && p.p90_ms <= p.p99_ms && p.p99_ms <= p.p999_ms);
        // Too large to hold: clamped, not dropped.
        record(&mut h, Duration::from_secs(3600));
        assert_eq!(h.len(), 1001);
        assert_eq!(
            Percentiles::of(&latency_histogram()),
            Percentiles::default()
        );
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn writes_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let panels = [Panel {
            title: "latency",
            y_label: "ms",
            series: vec![
                Series {
                    name: "p50",
                    points: vec![(0.1, 1.0), (0.2, 2.0)],
                },
                Series {
                    name: "p99",
                    points: vec![(0.1, 3.0), (0.2, 4.0)],
                },
            ],
        }];
        plot_svg(&path, "test", &panels).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("p99") && svg.contains("latency"));
    }
}
