//! Every picture Tangram draws (`tangram simulate`, `tangram calibrate`, the rollout report)
//! goes through here, so that they read alike: panels on a grid, round ticks, and legends in
//! strips of their own under the panels, where no number of series can make them cover the
//! data. The only caller of plotters; SVG only, so no system fonts are needed.

use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A plotting failure (plotters' drawing errors, boxed).
#[derive(Debug, thiserror::Error)]
#[error("drawing the picture: {0}")]
pub struct PlotError(#[source] Box<dyn std::error::Error + Send + Sync>);

fn err<E: std::error::Error + Send + Sync + 'static>(e: E) -> PlotError {
    PlotError(Box::new(e))
}

/// Colours by index (matplotlib's tab10), reused past ten.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];

/// Colour `i` of the palette.
fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "sans-serif";
const PANEL_W: u32 = 600;
const PANEL_H: u32 = 360;
const KEY_ROW_H: u32 = 20;

/// A line, or the top edge of a stacked layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Its name in the legend.
    pub label: String,
    /// (x, y), in x order.
    pub points: Vec<(f64, f64)>,
    /// Palette index.
    pub color: usize,
    /// Drawn dashed (a second series of the same colour, or a limit).
    pub dashed: bool,
}

impl Line {
    /// A solid line.
    pub fn new(label: impl Into<String>, color: usize, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.into(),
            points,
            color,
            dashed: false,
        }
    }

    /// The same line, dashed.
    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }
}

/// One entry of a legend.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The text.
    pub label: String,
    /// Palette index.
    pub color: usize,
    /// A dashed stroke instead of a solid one.
    pub dashed: bool,
    /// A filled box (areas, bars) instead of a stroke.
    pub filled: bool,
}

impl Key {
    /// The key of a line.
    pub fn of(line: &Line) -> Self {
        Self {
            label: line.label.clone(),
            color: line.color,
            dashed: line.dashed,
            filled: false,
        }
    }

    /// The key of an area or a bar.
    pub fn fill(label: impl Into<String>, color: usize) -> Self {
        Self {
            label: label.into(),
            color,
            dashed: false,
            filled: true,
        }
    }
}

/// What a panel draws.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Lines over a numeric x, linear or logarithmic.
    Lines {
        /// Logarithmic x (values at or below 0 are dropped).
        log_x: bool,
        /// The lines.
        lines: Vec<Line>,
    },
    /// Areas stacked in order (first at the bottom), with lines drawn over them.
    Stacked {
        /// The layers; they share x values.
        layers: Vec<Line>,
        /// Lines over the layers (a limit, a total).
        lines: Vec<Line>,
    },
    /// Stacked bars, one per category: `parts[k].1[i]` is part `k` of category `i`.
    Bars {
        /// The categories, left to right.
        categories: Vec<String>,
        /// (name, palette index, value per category), stacked bottom up.
        parts: Vec<(String, usize, Vec<f64>)>,
    },
    /// A grid of cells, coloured from white (the smallest value) to dark blue (the largest)
    /// on a log scale, each labelled; NaN cells grey.
    Heat {
        /// Column names, left to right.
        xs: Vec<String>,
        /// Row names, bottom up.
        ys: Vec<String>,
        /// `values[row][column]`.
        values: Vec<Vec<f64>>,
        /// Cell labels, same shape as `values`.
        labels: Vec<Vec<String>>,
        /// Cells outlined in red, as (column, row).
        outlined: Vec<(usize, usize)>,
    },
}

/// One chart of a figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Its caption.
    pub title: String,
    /// The x axis' name.
    pub x_label: String,
    /// The y axis' name.
    pub y_label: String,
    /// The y range; from the data (from 0) when `None`.
    pub y_range: Option<(f64, f64)>,
    /// What it draws.
    pub body: Body,
    /// Its own legend, under it (the figure's legend serves what every panel shares).
    pub keys: Vec<Key>,
}

impl Panel {
    /// A panel of `body`, with no legend of its own and y from the data.
    pub fn new(
        title: impl Into<String>,
        x: impl Into<String>,
        y: impl Into<String>,
        body: Body,
    ) -> Self {
        Self {
            title: title.into(),
            x_label: x.into(),
            y_label: y.into(),
            y_range: None,
            body,
            keys: Vec::new(),
        }
    }
}

/// A picture: a title, panels on a grid, a shared legend at the bottom.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The title, on top.
    pub title: String,
    /// A smaller line under the title.
    pub subtitle: Option<String>,
    /// Panels per row.
    pub columns: usize,
    /// The panels, row by row.
    pub panels: Vec<Panel>,
    /// The legend every panel shares.
    pub legend: Vec<Key>,
    /// One panel's size in pixels (its own legend comes on top of that).
    pub panel_size: (u32, u32),
}

impl Figure {
    /// An empty figure of `columns` panels per row.
    pub fn new(title: impl Into<String>, columns: usize) -> Self {
        Self {
            title: title.into(),
            subtitle: None,
            columns: columns.max(1),
            panels: Vec::new(),
            legend: Vec::new(),
            panel_size: (PANEL_W, PANEL_H),
        }
    }

    /// The figure as an SVG document.
    pub fn svg(&self) -> Result<String, PlotError> {
        let cols = self.columns.max(1);
        let (pw, ph) = self.panel_size;
        let width = pw * cols as u32;
        let rows: Vec<&[Panel]> = self.panels.chunks(cols).collect();
        let row_heights: Vec<u32> = rows
            .iter()
            .map(|row| {
                ph + row
                    .iter()
                    .map(|p| keys_height(&p.keys, pw))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let head = if self.subtitle.is_some() { 52 } else { 34 };
        let foot = keys_height(&self.legend, width);
        let height = head + row_heights.iter().sum::<u32>() + foot;
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
            root.fill(&WHITE).map_err(err)?;
            let centre = Pos::new(HPos::Center, VPos::Top);
            root.draw_text(
                &self.title,
                &(FONT, 18).into_font().color(&BLACK).pos(centre),
                (width as i32 / 2, 8),
            )
            .map_err(err)?;
            if let Some(sub) = &self.subtitle {
                root.draw_text(
                    sub,
                    &(FONT, 13)
                        .into_font()
                        .color(&RGBColor(85, 85, 85))
                        .pos(centre),
                    (width as i32 / 2, 32),
                )
                .map_err(err)?;
            }
            let (_, mut rest) = root.split_vertically(head);
            for (row, h) in rows.iter().zip(&row_heights) {
                let (this, below) = rest.split_vertically(*h);
                rest = below;
                for (i, panel) in row.iter().enumerate() {
                    let x = pw as i32 * i as i32;
                    let cell = this.clone().shrink((x, 0), (pw, *h));
                    let (chart, keys) = cell.split_vertically(ph);
                    draw_panel(&chart, panel)?;
                    draw_keys(&keys, &panel.keys)?;
                }
            }
            draw_keys(&rest, &self.legend)?;
            root.present().map_err(err)?;
        }
        Ok(out)
    }
}

/// A tick label: the shortest decimal of `v` (ticks are round, so a few digits at most).
pub fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let s = format!("{:.6}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Whether the labels of one axis, in order, read as round ticks: evenly spaced by 1, 2, 2.5
/// or 5 times a power of ten and multiples of that step, or round numbers each 2 to 10 times
/// the one before (a log axis).
pub fn round_ticks(ticks: &[f64]) -> bool {
    let steps: Vec<f64> = ticks.windows(2).map(|w| w[1] - w[0]).collect();
    let Some(&step) = steps.first() else {
        return ticks.iter().all(|v| is_round(*v));
    };
    let even = steps.iter().all(|s| (s - step).abs() <= step.abs() * 1e-6)
        && is_round(step)
        && ticks
            .iter()
            .all(|v| ((v / step) - (v / step).round()).abs() < 1e-6);
    let log = ticks.iter().all(|v| *v > 0.0 && is_round(*v))
        && ticks
            .windows(2)
            .all(|w| w[1] / w[0] >= 2.0 - 1e-9 && w[1] / w[0] <= 10.0 + 1e-9);
    even || log
}

/// Whether `v` is a round number: 1, 2, 2.5 or 5 times a power of ten, or 0.
pub fn is_round(v: f64) -> bool {
    if v == 0.0 {
        return true;
    }
    let v = v.abs();
    let m = v / 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .any(|r| (m - r).abs() < 1e-6)
}

/// Legend entries laid in columns as wide as the longest label, wrapped to `width`.
fn key_layout(keys: &[Key], width: u32) -> (u32, usize) {
    let longest = keys
        .iter()
        .map(|k| k.label.chars().count())
        .max()
        .unwrap_or(0);
    let col_w = (longest as u32 * 7 + 40).max(90);
    let cols = ((width.saturating_sub(20)) / col_w).max(1) as usize;
    (col_w, cols)
}

fn keys_height(keys: &[Key], width: u32) -> u32 {
    if keys.is_empty() {
        return 0;
    }
    let (_, cols) = key_layout(keys, width);
    keys.len().div_ceil(cols) as u32 * KEY_ROW_H + 10
}

fn draw_keys(area: &DrawingArea<SVGBackend<'_>, Shift>, keys: &[Key]) -> Result<(), PlotError> {
    if keys.is_empty() {
        return Ok(());
    }
    let (width, _) = area.dim_in_pixel();
    let (col_w, cols) = key_layout(keys, width);
    let used = col_w * cols.min(keys.len()) as u32;
    let left = (width.saturating_sub(used) / 2) as i32;
    for (i, k) in keys.iter().enumerate() {
        let x = left + (i % cols) as i32 * col_w as i32;
        let y = 4 + (i / cols) as i32 * KEY_ROW_H as i32 + KEY_ROW_H as i32 / 2;
        let c = color(k.color);
        if k.filled {
            area.draw(&Rectangle::new([(x, y - 6), (x + 22, y + 6)], c.filled()))
                .map_err(err)?;
        } else if k.dashed {
            for s in [0, 9, 18] {
                area.draw(&PathElement::new(
                    vec![(x + s, y), (x + s + 5, y)],
                    c.stroke_width(2),
                ))
                .map_err(err)?;
            }
        } else {
            area.draw(&PathElement::new(
                vec![(x, y), (x + 22, y)],
                c.stroke_width(2),
            ))
            .map_err(err)?;
        }
        area.draw(&Text::new(
            k.label.clone(),
            (x + 28, y),
            (FONT, 13)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
    }
    Ok(())
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, p: &Panel) -> Result<(), PlotError> {
    let mut b = ChartBuilder::on(area);
    b.caption(&p.title, (FONT, 15))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64);
    match &p.body {
        Body::Lines { log_x, lines } => {
            let pts = || lines.iter().flat_map(|l| &l.points);
            let (x0, x1) = if *log_x {
                bounds(pts().map(|q| q.0).filter(|x| *x > 0.0))
            } else {
                from_zero(pts().map(|q| q.0))
            };
            let (y0, y1) = p.y_range.unwrap_or((0.0, nice_max(pts().map(|q| q.1))));
            if *log_x {
                let (lo, hi) = decades(x0, x1);
                // Two decades or fewer have room for 2 and 5 between the powers of ten.
                let few = hi / lo <= 100.0 * (1.0 + 1e-9);
                let label = |v: &f64| {
                    if is_round(*v) && (few || !is_two_five(*v)) {
                        tick(*v)
                    } else {
                        String::new()
                    }
                };
                // A hair wider than the decades, or rounding drops the first power's tick.
                let range = (lo * (1.0 - 1e-9))..(hi * (1.0 + 1e-9));
                let mut c = b
                    .build_cartesian_2d(range.log_scale(), y0..y1)
                    .map_err(err)?;
                c.configure_mesh()
                    .x_desc(&p.x_label)
                    .y_desc(&p.y_label)
                    .x_labels(12)
                    .y_labels(6)
                    .x_label_formatter(&label)
                    .y_label_formatter(&|v| tick(*v))
                    .label_style((FONT, 13))
                    .light_line_style(TRANSPARENT)
                    .bold_line_style(RGBColor(225, 225, 225))
                    .draw()
                    .map_err(err)?;
                for l in lines {
                    let pts: Vec<(f64, f64)> =
                        l.points.iter().copied().filter(|q| q.0 > 0.0).collect();
                    draw_line(&mut c, l, pts)?;
                }
            } else {
                let mut c = b.build_cartesian_2d(x0..x1, y0..y1).map_err(err)?;
                mesh(&mut c, p)?;
                for l in lines {
                    draw_line(&mut c, l, l.points.clone())?;
                }
            }
        }
        Body::Stacked { layers, lines } => {
            let (x0, x1) = from_zero(
                layers
                    .iter()
                    .chain(lines)
                    .flat_map(|l| &l.points)
                    .map(|q| q.0),
            );
            let tops = stack(layers);
            let top = tops
                .last()
                .into_iter()
                .flatten()
                .map(|q| q.1)
                .chain(lines.iter().flat_map(|l| &l.points).map(|q| q.1));
            let (y0, y1) = p.y_range.unwrap_or((0.0, nice_max(top)));
            let mut c = b.build_cartesian_2d(x0..x1, y0..y1).map_err(err)?;
            mesh(&mut c, p)?;
            // Highest sum first, each lower sum painted over it: the bands between are the
            // layers.
            for (l, pts) in layers.iter().zip(&tops).rev() {
                let col = color(l.color);
                c.draw_series(AreaSeries::new(
                    pts.iter().copied(),
                    0.0,
                    col.mix(0.85).filled(),
                ))
                .map_err(err)?;
            }
            for l in lines {
                draw_line(&mut c, l, l.points.clone())?;
            }
        }
        Body::Bars { categories, parts } => {
            let n = categories.len().max(1);
            let sums = (0..n).map(|i| {
                parts
                    .iter()
                    .map(|p| p.2.get(i).copied().unwrap_or(0.0))
                    .sum()
            });
            let (y0, y1) = p.y_range.unwrap_or((0.0, nice_max(sums)));
            let mut c = b.build_cartesian_2d(segments(n), y0..y1).map_err(err)?;
            let name = |v: &SegmentValue<usize>| match v {
                SegmentValue::CenterOf(i) => categories.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            };
            c.configure_mesh()
                .x_desc(&p.x_label)
                .y_desc(&p.y_label)
                .x_labels(n)
                .y_labels(6)
                .x_label_formatter(&name)
                .y_label_formatter(&|v| tick(*v))
                .label_style((FONT, 13))
                .light_line_style(TRANSPARENT)
                .bold_line_style(RGBColor(225, 225, 225))
                .disable_x_mesh()
                .draw()
                .map_err(err)?;
            for i in 0..n {
                let mut base = 0.0;
                for (_, k, values) in parts {
                    let v = values.get(i).copied().unwrap_or(0.0).max(0.0);
                    if v > 0.0 {
                        let mut r = Rectangle::new(
                            [
                                (SegmentValue::Exact(i), base),
                                (SegmentValue::Exact(i + 1), base + v),
                            ],
                            color(*k).filled(),
                        );
                        r.set_margin(0, 0, 14, 14);
                        c.draw_series(std::iter::once(r)).map_err(err)?;
                    }
                    base += v;
                }
            }
        }
        Body::Heat {
            xs,
            ys,
            values,
            labels,
            outlined,
        } => {
            let (nx, ny) = (xs.len().max(1), ys.len().max(1));
            let mut c = b
                .build_cartesian_2d(segments(nx), segments(ny))
                .map_err(err)?;
            let xname = |v: &SegmentValue<usize>| match v {
                SegmentValue::CenterOf(i) => xs.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            };
            let yname = |v: &SegmentValue<usize>| match v {
                SegmentValue::CenterOf(i) => ys.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            };
            c.configure_mesh()
                .x_desc(&p.x_label)
                .y_desc(&p.y_label)
                .x_labels(nx)
                .y_labels(ny)
                .x_label_formatter(&xname)
                .y_label_formatter(&yname)
                .label_style((FONT, 13))
                .disable_mesh()
                .draw()
                .map_err(err)?;
            let finite = values.iter().flatten().copied().filter(|v| v.is_finite());
            let lo = finite
                .clone()
                .fold(f64::INFINITY, f64::min)
                .clamp(1e-3, 1.0);
            let hi = finite.fold(0.0, f64::max).max(lo * 1.01);
            for (j, row) in values.iter().enumerate() {
                for (i, v) in row.iter().enumerate() {
                    let (fill, ink) = if v.is_finite() {
                        let t = ((v.max(lo) / lo).ln() / (hi / lo).ln()).clamp(0.0, 1.0);
                        let mixc = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
                        let fill =
                            RGBColor(mixc(255.0, 8.0), mixc(255.0, 48.0), mixc(255.0, 107.0));
                        (fill, if t > 0.55 { WHITE } else { BLACK })
                    } else {
                        (RGBColor(238, 238, 238), BLACK)
                    };
                    let cell = [
                        (SegmentValue::Exact(i), SegmentValue::Exact(j)),
                        (SegmentValue::Exact(i + 1), SegmentValue::Exact(j + 1)),
                    ];
                    c.draw_series([
                        Rectangle::new(cell.clone(), fill.filled()),
                        Rectangle::new(cell, RGBColor(204, 204, 204).stroke_width(1)),
                    ])
                    .map_err(err)?;
                    let text = labels
                        .get(j)
                        .and_then(|r| r.get(i))
                        .cloned()
                        .unwrap_or_default();
                    c.draw_series(std::iter::once(Text::new(
                        text,
                        (SegmentValue::CenterOf(i), SegmentValue::CenterOf(j)),
                        (FONT, 13)
                            .into_font()
                            .color(&ink)
                            .pos(Pos::new(HPos::Center, VPos::Center)),
                    )))
                    .map_err(err)?;
                }
            }
            // A path, not a rectangle: the SVG backend draws a rectangle's outline 1 px wide.
            for &(i, j) in outlined {
                let (x0, x1) = (SegmentValue::Exact(i), SegmentValue::Exact(i + 1));
                let (y0, y1) = (SegmentValue::Exact(j), SegmentValue::Exact(j + 1));
                let corners = vec![
                    (x0.clone(), y0.clone()),
                    (x1.clone(), y0.clone()),
                    (x1, y1.clone()),
                    (x0.clone(), y1),
                    (x0, y0),
                ];
                c.draw_series(std::iter::once(PathElement::new(
                    corners,
                    PALETTE[1].stroke_width(3),
                )))
                .map_err(err)?;
            }
        }
    }
    Ok(())
}

fn mesh(
    c: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    p: &Panel,
) -> Result<(), PlotError> {
    c.configure_mesh()
        .x_desc(&p.x_label)
        .y_desc(&p.y_label)
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FONT, 13))
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw_line<'a, X>(
    c: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, RangedCoordf64>>,
    l: &Line,
    pts: Vec<(f64, f64)>,
) -> Result<(), PlotError>
where
    X: Ranged<ValueType = f64>,
{
    let style = color(l.color).stroke_width(2);
    if l.dashed {
        c.draw_series(DashedLineSeries::new(pts, 8, 5, style))
            .map_err(err)?;
    } else {
        c.draw_series(LineSeries::new(pts, style)).map_err(err)?;
    }
    Ok(())
}

/// `n` categories (at least one) as segments 0 to n - 1: plotters' integer ranges include
/// their end, so `0..n` would leave an empty one on the right.
fn segments(
    n: usize,
) -> plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordusize> {
    (0..n.max(1) - 1).into_segmented()
}

/// Cumulative tops of stacked layers, on the first layer's x values.
fn stack(layers: &[Line]) -> Vec<Vec<(f64, f64)>> {
    let Some(first) = layers.first() else {
        return Vec::new();
    };
    let xs: Vec<f64> = first.points.iter().map(|q| q.0).collect();
    let mut acc = vec![0.0; xs.len()];
    layers
        .iter()
        .map(|l| {
            for (i, a) in acc.iter_mut().enumerate() {
                *a += l.points.get(i).map_or(0.0, |q| q.1);
            }
            xs.iter().copied().zip(acc.iter().copied()).collect()
        })
        .collect()
}

/// The x range of a linear axis: from 0 (times and counts start there) unless a value is
/// negative, to the largest value.
fn from_zero(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = bounds(xs);
    (lo.min(0.0), hi)
}

/// The smallest and largest of `xs` (0 to 1 when there are none, widened when equal).
fn bounds(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = xs
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo, lo + 1.0)
    }
}

/// The whole decades around [lo, hi] (at least one).
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let a = lo.max(1e-9).log10().floor();
    let b = hi.max(1e-9).log10().ceil().max(a + 1.0);
    (10f64.powf(a), 10f64.powf(b))
}

/// The round number at or above the largest of `ys` (1 when there is none), so the top
/// tick closes the axis.
fn nice_max(ys: impl Iterator<Item = f64>) -> f64 {
    let m = ys.filter(|y| y.is_finite()).fold(0.0, f64::max);
    if m <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(m.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|r| r * p)
        .find(|v| *v >= m * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// 2 or 5 times a power of ten (a log axis labels only the powers, to stay uncrowded).
fn is_two_five(v: f64) -> bool {
    let m = v / 10f64.powf(v.log10().floor());
    (m - 2.0).abs() < 1e-6 || (m - 2.5).abs() < 1e-6 || (m - 5.0).abs() < 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every `<text>` element.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_string())
            })
            .collect()
    }

    #[test]
    fn ticks_are_round_and_short() {
        assert_eq!(tick(0.2), "0.2");
        assert_eq!(tick(1500.0), "1500");
        assert_eq!(tick(-0.0), "0");
        assert!(is_round(0.25) && is_round(2000.0) && is_round(5e-3));
        assert!(!is_round(0.3) && !is_round(1234.0) && !is_round(0.125));
        assert_eq!(nice_max([0.0, 7.3].into_iter()), 10.0);
        assert_eq!(nice_max([1.0].into_iter()), 1.0);
        assert_eq!(nice_max([0.0, 180.0].into_iter()), 200.0);
        assert_eq!(nice_max(std::iter::empty()), 1.0);
    }

    #[test]
    fn every_numeric_label_of_a_line_chart_is_a_round_tick() {
        let mut f = Figure::new("t", 2);
        let line = |c, k: f64| {
            Line::new(
                format!("policy {c}"),
                c,
                (0..50).map(|i| (i as f64 * 7.3, k * i as f64)).collect(),
            )
        };
        f.panels.push(Panel::new(
            "a",
            "time (s)",
            "y",
            Body::Lines {
                log_x: false,
                lines: vec![line(0, 1.7), line(1, 3.1)],
            },
        ));
        f.panels.push(Panel::new(
            "b",
            "ACT (s)",
            "fraction",
            Body::Lines {
                log_x: true,
                lines: vec![Line::new(
                    "x",
                    2,
                    vec![(0.013, 0.0), (3.7, 0.5), (41.0, 1.0)],
                )],
            },
        ));
        let svg = f.svg().unwrap();
        let numbers: Vec<f64> = texts(&svg).iter().filter_map(|t| t.parse().ok()).collect();
        assert!(numbers.len() >= 10, "{numbers:?}");
        // Axis by axis: each run of increasing labels.
        let mut axes: Vec<Vec<f64>> = vec![];
        for v in numbers {
            match axes.last_mut() {
                Some(a) if a.last().is_some_and(|l| v > *l) => a.push(v),
                _ => axes.push(vec![v]),
            }
        }
        assert_eq!(axes.len(), 4, "{axes:?}");
        assert!(axes.iter().all(|a| round_ticks(a)), "{axes:?}");
        assert!(!round_ticks(&[0.0, 0.3, 0.6]) && !round_ticks(&[1.0, 2.0, 4.0]));
    }

    #[test]
    fn legends_wrap_into_rows_under_the_panels_however_many_series() {
        let mut f = Figure::new("t", 2);
        let lines: Vec<Line> = (0..12)
            .map(|i| {
                Line::new(
                    format!("tangram-v2-learned-{i}"),
                    i,
                    vec![(0.0, 0.0), (1.0, i as f64)],
                )
            })
            .collect();
        f.legend = lines.iter().map(Key::of).collect();
        f.panels.push(Panel::new(
            "a",
            "x",
            "y",
            Body::Lines {
                log_x: false,
                lines,
            },
        ));
        let svg = f.svg().unwrap();
        let (col_w, cols) = key_layout(&f.legend, 1200);
        assert!((2..12).contains(&cols), "{cols}");
        // The figure grew by the legend's rows, all below the panel.
        let rows = 12usize.div_ceil(cols) as u32;
        assert!(
            svg.contains(&format!(
                "height=\"{}\"",
                34 + PANEL_H + rows * KEY_ROW_H + 10
            )),
            "{col_w}"
        );
        for i in 0..12 {
            assert!(texts(&svg).contains(&format!("tangram-v2-learned-{i}")));
        }
    }

    #[test]
    fn stacked_layers_sum_and_bars_stack() {
        let a = Line::new("a", 0, vec![(0.0, 1.0), (1.0, 2.0)]);
        let b = Line::new("b", 1, vec![(0.0, 3.0), (1.0, 1.0)]);
        assert_eq!(
            stack(&[a.clone(), b.clone()])[1],
            vec![(0.0, 4.0), (1.0, 3.0)]
        );
        let mut f = Figure::new("t", 1);
        f.panels.push(Panel::new(
            "s",
            "x",
            "y",
            Body::Stacked {
                layers: vec![a, b],
                lines: vec![],
            },
        ));
        f.panels.push(Panel::new(
            "bars",
            "kind",
            "ms",
            Body::Bars {
                categories: vec!["exec".into(), "api".into()],
                parts: vec![
                    ("queued".into(), 0, vec![1.0, 2.0]),
                    ("exec".into(), 2, vec![3.0, 0.0]),
                ],
            },
        ));
        let svg = f.svg().unwrap();
        assert_eq!(svg.matches("<polygon").count(), 2, "{svg}");
        let t = texts(&svg);
        assert!(t.contains(&"exec".to_string()) && t.contains(&"api".to_string()));
    }
}
