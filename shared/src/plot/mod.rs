//! Every picture Tangram draws (`tangram simulate`, `tangram calibrate`, the rollout report)
//! goes through here, so that they read alike: panels on a grid, round ticks, and legends in
//! strips of their own under the panels, where no number of series can make them cover the
//! data. The only caller of plotters; SVG only, so no system fonts are needed.

mod draw;
mod scale;

pub use scale::{is_round, round_ticks, tick};

use draw::{draw_keys, draw_panel, keys_height};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A plotting failure (plotters' drawing errors, boxed).
#[derive(Debug, thiserror::Error)]
#[error("drawing the picture: {0}")]
pub struct PlotError(#[source] Box<dyn std::error::Error + Send + Sync>);

fn err<E: std::error::Error + Send + Sync + 'static>(e: E) -> PlotError {
    PlotError(Box::new(e))
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
        let sub_lines = self
            .subtitle
            .as_deref()
            .map(|s| wrap(s, chars_across(width, SUBTITLE_PX)))
            .unwrap_or_default();
        let head = 34 + SUBTITLE_LINE * sub_lines.len() as u32;
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
            for (i, line) in sub_lines.iter().enumerate() {
                root.draw_text(
                    line,
                    &(FONT, SUBTITLE_PX)
                        .into_font()
                        .color(&RGBColor(85, 85, 85))
                        .pos(centre),
                    (width as i32 / 2, 32 + (SUBTITLE_LINE as i32) * i as i32),
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

/// The subtitle's font size, and the height of one of its lines.
const SUBTITLE_PX: u32 = 13;
const SUBTITLE_LINE: u32 = 18;

/// About how many characters of a `px` font fit across `width` pixels, with a margin (an
/// average glyph of this font is a little over half its size wide).
fn chars_across(width: u32, px: u32) -> usize {
    ((width.saturating_sub(40)) as f64 / (px as f64 * 0.56)).max(20.0) as usize
}

/// `text` in lines of at most `max` characters, broken between words (a word longer than a
/// line stands alone).
fn wrap(text: &str, max: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= max => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_subtitle_is_wrapped_between_words_to_the_figures_width() {
        let lines = super::wrap(
            "cell: fewest GPUs within 10% of static; fixed: 9 teachers",
            25,
        );
        assert_eq!(
            lines,
            [
                "cell: fewest GPUs within",
                "10% of static; fixed: 9",
                "teachers"
            ]
        );
        assert!(lines.iter().all(|l| l.chars().count() <= 25));
        assert_eq!(super::wrap("short", 25), ["short"]);
        // A 760-pixel figure takes about a hundred characters of 13 px a line.
        let n = super::chars_across(760, 13);
        assert!((90..=105).contains(&n), "{n}");
    }

    use super::draw::{key_layout, stack};
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
