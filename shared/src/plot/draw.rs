//! Drawing with plotters: one panel's chart, and the legend strips. The legend's layout lives
//! here too, since the figure sizes its rows by the height it gives.

use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::scale::{bounds, decades, from_zero, is_round, is_two_five, nice_max, tick};
use super::{err, Body, Key, Line, Panel, PlotError, FONT, KEY_ROW_H};

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

/// Legend entries laid in columns as wide as the longest label, wrapped to `width`.
pub(super) fn key_layout(keys: &[Key], width: u32) -> (u32, usize) {
    let longest = keys
        .iter()
        .map(|k| k.label.chars().count())
        .max()
        .unwrap_or(0);
    let col_w = (longest as u32 * 7 + 40).max(90);
    let cols = ((width.saturating_sub(20)) / col_w).max(1) as usize;
    (col_w, cols)
}

pub(super) fn keys_height(keys: &[Key], width: u32) -> u32 {
    if keys.is_empty() {
        return 0;
    }
    let (_, cols) = key_layout(keys, width);
    keys.len().div_ceil(cols) as u32 * KEY_ROW_H + 10
}

pub(super) fn draw_keys(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    keys: &[Key],
) -> Result<(), PlotError> {
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

pub(super) fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    p: &Panel,
) -> Result<(), PlotError> {
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
pub(super) fn stack(layers: &[Line]) -> Vec<Vec<(f64, f64)>> {
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
