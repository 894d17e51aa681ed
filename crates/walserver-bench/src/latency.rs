//! Latency distributions as files and as a plot: `append --latency-out FILE` writes the run's
//! latencies, `latency-plot` draws the distributions of several runs (walserver's and
//! pgbench's, say) as cumulative curves in one SVG.
//!
//! The file format is text, one line per distinct latency: `MICROSECONDS COUNT`, or just
//! `MICROSECONDS` for a count of one (what pgbench's per-transaction log gives after `awk
//! '{ print $3 }'`). Lines that are empty or start with `#` are skipped; anything else that
//! does not parse is an error naming the line.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use hdrhistogram::Histogram;

/// Writes every value the histogram recorded (in microseconds) with its count.
pub fn write_histogram(h: &Histogram<u64>, path: &Path) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    writeln!(out, "# latency_us count")?;
    for v in h.iter_recorded() {
        writeln!(
            out,
            "{} {}",
            h.highest_equivalent(v.value_iterated_to()),
            v.count_at_value()
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Reads a latency file into (microseconds, count) pairs, sorted by latency.
pub fn read(path: &Path) -> anyhow::Result<Vec<(u64, u64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).with_context(|| format!("in {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let bad = || {
            anyhow::anyhow!(
                "line {}: expected `MICROSECONDS [COUNT]`, got {line:?}",
                i + 1
            )
        };
        let us: f64 = fields.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let count: u64 = match fields.next() {
            Some(c) => c.parse().map_err(|_| bad())?,
            None => 1,
        };
        if fields.next().is_some() || !us.is_finite() || us < 0.0 {
            return Err(bad());
        }
        points.push((us.round() as u64, count));
    }
    points.sort_unstable();
    Ok(points)
}

/// The cumulative distribution: (latency in ms, fraction of samples at or below it).
pub fn cdf(points: &[(u64, u64)]) -> Vec<(f64, f64)> {
    let total: u64 = points.iter().map(|p| p.1).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut seen = 0u64;
    points
        .iter()
        .map(|&(us, n)| {
            seen += n;
            (us as f64 / 1000.0, seen as f64 / total as f64)
        })
        .collect()
}

/// The latency at quantile `q` (0..=1), in ms.
pub fn quantile(points: &[(u64, u64)], q: f64) -> Option<f64> {
    let total: u64 = points.iter().map(|p| p.1).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for &(us, n) in points {
        seen += n;
        if seen >= rank {
            return Some(us as f64 / 1000.0);
        }
    }
    None
}

/// Draws each named distribution as a cumulative curve over a logarithmic latency axis.
pub fn plot(path: &Path, title: &str, series: &[(String, Vec<(u64, u64)>)]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let curves: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, pts)| {
            let p50 = quantile(pts, 0.5).unwrap_or(0.0);
            let p99 = quantile(pts, 0.99).unwrap_or(0.0);
            (
                format!("{name} (p50 {p50:.3} ms, p99 {p99:.3} ms)"),
                cdf(pts),
            )
        })
        .collect();
    let all = curves.iter().flat_map(|c| c.1.iter().map(|p| p.0));
    let x_min = all.clone().fold(f64::INFINITY, f64::min).max(0.001);
    let x_max = all.fold(0.0f64, f64::max).max(x_min * 10.0);
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min * 0.9..x_max * 1.1).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log scale)")
        .y_desc("fraction of commits at or below")
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (name, points)) in curves.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), &color))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_line_forms_and_names_a_bad_line() {
        let p = parse("# latency_us count\n250 3\n\n100\n").unwrap();
        assert_eq!(p, vec![(100, 1), (250, 3)]);
        let e = parse("100 1\nfast\n").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        assert!(parse("100 1 2\n").is_err());
        assert!(parse("-5\n").is_err());
    }

    #[test]
    fn the_cdf_and_quantiles_follow_the_counts() {
        let p = vec![(1000, 1), (2000, 2), (4000, 1)];
        assert_eq!(cdf(&p), vec![(1.0, 0.25), (2.0, 0.75), (4.0, 1.0)]);
        assert_eq!(quantile(&p, 0.5), Some(2.0));
        assert_eq!(quantile(&p, 0.99), Some(4.0));
        assert_eq!(quantile(&p, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_histogram_round_trips_through_its_file_and_plots() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = crate::report::latency_histogram();
        for us in [120u64, 120, 350, 9000] {
            h.record(us).unwrap();
        }
        let path = dir.path().join("lat.txt");
        write_histogram(&h, &path).unwrap();
        let p = read(&path).unwrap();
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 4);
        assert_eq!(
            quantile(&p, 0.5).map(|ms| (ms * 1000.0).round()),
            Some(120.0)
        );
        let svg = dir.path().join("cdf.svg");
        plot(&svg, "t", &[("a".into(), p)]).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("<svg") && text.contains("p50 0.120 ms"),
            "{}",
            &text[..200.min(text.len())]
        );
    }
}
