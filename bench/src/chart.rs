//! Hand-written SVG bar charts: one function, [`bar_chart`], draws every chart of the report
//! from labelled series (no plotting dependency).
//!
//! A chart is one or more panels stacked vertically, each with its own axis. A panel has
//! groups (the rows: approaches, numbers of waiters, servers...) and series (one bar per group
//! each, in the legend's colour), on a linear or a log scale. A value that is not finite (a
//! figure that was not measured) gets no bar and the label "n/a".

use std::fmt::Write as _;

/// How a panel's axis maps values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// From 0 to a round number above the largest value.
    Linear,
    /// Whole decades around the values (all must be positive to get a bar).
    Log,
}

/// One series: a name for the legend and a value per group.
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

impl Series {
    pub fn new(name: impl Into<String>, values: Vec<f64>) -> Series {
        Series {
            name: name.into(),
            values,
        }
    }
}

/// One panel: a title, the groups (rows), the series and how values are shown.
pub struct Panel {
    pub title: String,
    pub groups: Vec<String>,
    pub series: Vec<Series>,
    pub scale: Scale,
    /// Formats a value for its bar's label and the axis ticks.
    pub format: fn(f64) -> String,
}

const WIDTH: f64 = 900.0;
const RIGHT: f64 = 110.0;
const BAR: f64 = 16.0;
const BAR_GAP: f64 = 3.0;
const GROUP_GAP: f64 = 14.0;
const COLOURS: [&str; 6] = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
];

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round step (1, 2 or 5 times a power of ten) for about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    mag * if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// The axis of a panel: its ticks and the map from a value to a fraction of the bar span.
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    fn new(scale: Scale, values: impl Iterator<Item = f64> + Clone) -> Axis {
        match scale {
            Scale::Linear => {
                let max = values
                    .filter(|v| v.is_finite())
                    .fold(0.0f64, f64::max)
                    .max(f64::MIN_POSITIVE);
                let step = nice_step(max);
                let hi = (max / step).ceil() * step;
                let n = (hi / step).round() as usize;
                Axis {
                    scale,
                    lo: 0.0,
                    hi,
                    ticks: (0..=n).map(|i| step * i as f64).collect(),
                }
            }
            Scale::Log => {
                let positive = values.filter(|v| v.is_finite() && *v > 0.0);
                let min = positive.clone().fold(f64::INFINITY, f64::min);
                let max = positive.fold(0.0f64, f64::max);
                let (min, max) = if min.is_finite() {
                    (min, max)
                } else {
                    (1.0, 10.0)
                };
                // A decade below the smallest value, so that no bar is of zero length.
                let mut lo = min.log10().floor();
                if (min.log10() - lo) < 0.15 {
                    lo -= 1.0;
                }
                let hi = max.log10().ceil().max(lo + 1.0);
                Axis {
                    scale,
                    lo,
                    hi,
                    ticks: (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect(),
                }
            }
        }
    }

    /// Where `v` falls, from 0 (the axis start) to 1 (its end).
    fn frac(&self, v: f64) -> f64 {
        let f = match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log if v > 0.0 => (v.log10() - self.lo) / (self.hi - self.lo),
            Scale::Log => 0.0,
        };
        f.clamp(0.0, 1.0)
    }
}

/// An SVG of `panels` under `title`.
pub fn bar_chart(title: &str, panels: &[Panel]) -> String {
    // Room for the longest group label (about 7.5 px a character at 13 px).
    let longest = panels
        .iter()
        .flat_map(|p| p.groups.iter())
        .map(|g| g.chars().count())
        .max()
        .unwrap_or(0);
    let left = (7.5 * longest as f64 + 20.0).clamp(120.0, 420.0);
    let span = WIDTH - left - RIGHT;
    let mut body = String::new();
    let mut y = 34.0;
    let _ = write!(
        body,
        r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for p in panels {
        if !p.title.is_empty() {
            y += 14.0;
            let _ = write!(
                body,
                r#"<text x="10" y="{y}" font-size="14" font-weight="bold">{}</text>"#,
                esc(&p.title)
            );
        }
        y += 8.0;
        // Legend.
        if p.series.len() > 1 {
            let mut lx = left;
            for (i, s) in p.series.iter().enumerate() {
                let _ = write!(
                    body,
                    r#"<rect x="{lx}" y="{y}" width="12" height="12" fill="{}"/>"#,
                    COLOURS[i % COLOURS.len()]
                );
                let _ = write!(
                    body,
                    r#"<text x="{}" y="{}">{}</text>"#,
                    lx + 16.0,
                    y + 11.0,
                    esc(&s.name)
                );
                lx += 32.0 + 7.5 * s.name.chars().count() as f64;
            }
            y += 20.0;
        }
        let axis = Axis::new(
            p.scale,
            p.series.iter().flat_map(|s| s.values.iter().copied()),
        );
        let group_h = p.series.len() as f64 * (BAR + BAR_GAP) - BAR_GAP;
        let top = y;
        let bottom = top + p.groups.len() as f64 * (group_h + GROUP_GAP);
        for &t in &axis.ticks {
            let gx = left + span * axis.frac(t);
            let _ = write!(
                body,
                r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{bottom}" stroke="#ddd"/>"##
            );
            let _ = write!(
                body,
                r##"<text x="{gx:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
                bottom + 15.0,
                esc(&(p.format)(t))
            );
        }
        for (g, group) in p.groups.iter().enumerate() {
            let gy = top + g as f64 * (group_h + GROUP_GAP) + GROUP_GAP / 2.0;
            let _ = write!(
                body,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                left - 8.0,
                gy + group_h / 2.0 + 5.0,
                esc(group)
            );
            for (i, s) in p.series.iter().enumerate() {
                let by = gy + i as f64 * (BAR + BAR_GAP);
                let v = s.values.get(g).copied().unwrap_or(f64::NAN);
                let (w, label) = if v.is_finite() {
                    (span * axis.frac(v), (p.format)(v))
                } else {
                    (0.0, "n/a".to_string())
                };
                let _ = write!(
                    body,
                    r#"<rect x="{left}" y="{by:.1}" width="{w:.1}" height="{BAR}" fill="{}"/>"#,
                    COLOURS[i % COLOURS.len()]
                );
                let _ = write!(
                    body,
                    r##"<text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
                    left + w + 4.0,
                    by + 12.5,
                    esc(&label)
                );
            }
        }
        let _ = write!(
            body,
            r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#888"/>"##
        );
        y = bottom + 30.0;
    }
    let h = y;
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" font-family="sans-serif" font-size="13"><rect width="100%" height="100%" fill="white"/>{body}</svg>
"#
    )
}

/// Microseconds, as µs, ms or s.
pub fn fmt_us(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.0} µs")
    } else if v < 1e6 {
        let ms = v / 1000.0;
        if ms < 10.0 {
            format!("{ms:.1} ms")
        } else {
            format!("{ms:.0} ms")
        }
    } else {
        format!("{:.1} s", v / 1e6)
    }
}

/// Microseconds with one decimal (server time).
pub fn fmt_us1(v: f64) -> String {
    format!("{v:.1} µs")
}

/// Bytes, as B, KB or MB.
pub fn fmt_bytes(v: f64) -> String {
    if v.abs() < 10_000.0 {
        format!("{v:.0} B")
    } else if v.abs() < 10_000_000.0 {
        format!("{:.0} KB", v / 1000.0)
    } else {
        format!("{:.0} MB", v / 1e6)
    }
}

/// A count or a rate, with thousands as k.
pub fn fmt_num(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axis_spans_whole_decades_below_and_above() {
        let a = Axis::new(Scale::Log, [316.0, 100_900.0].into_iter());
        assert_eq!(a.ticks.first().copied(), Some(100.0));
        assert_eq!(a.ticks.last().copied(), Some(1e6));
        assert!(a.frac(316.0) > 0.0);
        // Close above a decade: one more below it, so the bar shows.
        let a = Axis::new(Scale::Log, [116.0].into_iter());
        assert_eq!(a.ticks.first().copied(), Some(10.0));
    }

    #[test]
    fn linear_axis_ends_on_a_round_number() {
        let a = Axis::new(Scale::Linear, [245.0, 165.0].into_iter());
        assert_eq!(a.hi, 250.0);
        assert_eq!(a.frac(125.0), 0.5);
    }

    #[test]
    fn missing_values_get_no_bar() {
        let svg = bar_chart(
            "t",
            &[Panel {
                title: "p".into(),
                groups: vec!["a & b".into()],
                series: vec![Series::new("s", vec![f64::NAN])],
                scale: Scale::Linear,
                format: fmt_num,
            }],
        );
        assert!(svg.contains("n/a") && svg.contains("a &amp; b"));
    }
}
