//! The floating-point formats of mixed precision, bit by bit: fp32, bf16
//! and fp16 as a sign, an exponent and a mantissa, each with the range and
//! the precision its widths give, worked out from the widths (IEEE 754's
//! rules), not typed.

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use crate::loss::plot_error;
use crate::numbers::format::grouped;
use crate::style::{centred, font, FORWARD, OTHER, SECOND, SMALL, TEXT, TITLE, WIDTH};

/// A binary floating-point format: one sign bit, then its exponent and mantissa bits.
pub struct Format {
    pub name: &'static str,
    pub exponent: i32,
    pub mantissa: i32,
}

/// The chapter's order: f32, then the two 16-bit formats, bf16 first
/// because it is f32's top half.
pub const FORMATS: [Format; 3] = [
    Format { name: "fp32", exponent: 8, mantissa: 23 },
    Format { name: "bf16", exponent: 8, mantissa: 7 },
    Format { name: "fp16", exponent: 5, mantissa: 10 },
];

impl Format {
    /// The sign's, the exponent's and the mantissa's.
    pub fn bits(&self) -> i32 {
        1 + self.exponent + self.mantissa
    }

    /// The exponent of 1.0: half the exponent's range, less one.
    fn bias(&self) -> i32 {
        (1 << (self.exponent - 1)) - 1
    }

    /// The largest finite value: every mantissa bit set, under the largest
    /// exponent (the all-ones exponent is kept for infinity and NaN).
    pub fn largest(&self) -> f64 {
        (2.0 - self.epsilon()) * 2f64.powi(self.bias())
    }

    /// The smallest normal value: the lowest exponent (all zeros is kept
    /// for zero and the subnormals) with an empty mantissa.
    pub fn smallest_normal(&self) -> f64 {
        2f64.powi(1 - self.bias())
    }

    /// The gap between 1.0 and the next value up: the mantissa's last bit.
    pub fn epsilon(&self) -> f64 {
        2f64.powi(-self.mantissa)
    }
}

/// The fields' colours, from the shared palette (none is a pass or a collective here).
const FIELDS: [(&str, RGBColor); 3] = [("sign", OTHER), ("exponent", FORWARD), ("mantissa", SECOND)];

const LEFT: i32 = 72;
const BIT_PX: i32 = 19;
/// Where each of a format's three numbers starts, right of `LEFT`.
const NUMBER_COLUMNS: [i32; 3] = [0, 190, 420];
const BITS_H: i32 = 30;
const TOP: i32 = 40;
/// From one format's row to the next: its bits and the line of numbers under them.
const ROW: i32 = 84;
const NOTE_LINE: i32 = 19;

/// Draws each format's bits, most significant first, all three aligned on
/// the sign bit, with the numbers its widths give under them.
pub fn draw() -> Result<String> {
    let notes = [
        "computed from the widths (m mantissa bits, e exponent bits, bias b = 2^(e−1) − 1):",
        "largest (2 − 2^−m) · 2^b, smallest normal 2^(1−b), epsilon (the gap above 1.0) 2^−m",
        "bf16 is fp32's first 16 bits: the same exponent and range, 16 fewer mantissa bits",
    ];
    let height = (TOP + ROW * FORMATS.len() as i32 + NOTE_LINE * notes.len() as i32) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let title = "Three floating-point formats: the bits, the range and the precision they give";
        root.draw(&Text::new(title, (WIDTH as i32 / 2, 16), centred(TITLE, VPos::Center))).map_err(plot_error)?;
        for (row, format) in FORMATS.iter().enumerate() {
            let top = TOP + ROW * row as i32;
            let name_at = (LEFT / 2, top + BITS_H / 2);
            root.draw(&Text::new(format.name, name_at, centred(TEXT, VPos::Center))).map_err(plot_error)?;
            let widths = [1, format.exponent, format.mantissa];
            let mut first = 0;
            for ((field, color), width) in FIELDS.iter().zip(widths) {
                let (left, right) = (LEFT + BIT_PX * first, LEFT + BIT_PX * (first + width));
                root.draw(&Rectangle::new([(left, top), (right, top + BITS_H)], color.filled())).map_err(plot_error)?;
                for bit in first + 1..first + width {
                    let x = LEFT + BIT_PX * bit;
                    root.draw(&PathElement::new([(x, top), (x, top + BITS_H)], WHITE.mix(0.6).stroke_width(1)))
                        .map_err(plot_error)?;
                }
                let label = if width == 1 { "s".to_string() } else { format!("{field} {width}") };
                let style = centred(SMALL, VPos::Center).color(&WHITE);
                root.draw(&Text::new(label, ((left + right) / 2, top + BITS_H / 2), style)).map_err(plot_error)?;
                first += width;
            }
            let bits_at = (LEFT / 2, top + BITS_H + 16);
            root.draw(&Text::new(format!("{} bits", format.bits()), bits_at, centred(SMALL, VPos::Center)))
                .map_err(plot_error)?;
            let numbers = [
                format!("largest {}", scientific(format.largest())),
                format!("smallest normal {}", scientific(format.smallest_normal())),
                format!("epsilon 2{} ≈ {}", superscript(-format.mantissa), scientific(format.epsilon())),
            ];
            for (column, text) in NUMBER_COLUMNS.iter().zip(numbers) {
                root.draw(&Text::new(text, (LEFT + column, top + BITS_H + 9), font(SMALL))).map_err(plot_error)?;
            }
        }
        let notes_top = TOP + ROW * FORMATS.len() as i32;
        for (k, note) in notes.iter().enumerate() {
            let y = notes_top + NOTE_LINE * k as i32;
            root.draw(&Text::new(note.to_string(), (12, y), font(SMALL))).map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// `65,504` for a whole number the guide would write out, `3.40 × 10³⁸` otherwise.
fn scientific(value: f64) -> String {
    if value.fract() == 0.0 && value < 1e6 {
        return grouped(value, 0);
    }
    let power = value.log10().floor() as i32;
    format!("{:.2} × 10{}", value / 10f64.powi(power), superscript(power))
}

/// `n` in superscript digits: `³⁸`, `⁻⁷`.
fn superscript(n: i32) -> String {
    let digits = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let sign = if n < 0 { "⁻" } else { "" };
    sign.chars().chain(n.unsigned_abs().to_string().chars().map(|d| digits[d as usize - '0' as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> &'static Format {
        FORMATS.iter().find(|f| f.name == name).expect("a format of the figure")
    }

    #[test]
    fn fp32_from_its_widths_is_rusts_f32() {
        let fp32 = named("fp32");
        assert_eq!(fp32.bits(), 32);
        assert_eq!(fp32.largest(), f64::from(f32::MAX));
        assert_eq!(fp32.smallest_normal(), f64::from(f32::MIN_POSITIVE));
        assert_eq!(fp32.epsilon(), f64::from(f32::EPSILON));
    }

    #[test]
    fn the_16_bit_formats_from_their_widths_are_the_half_crates() {
        for (format, largest, smallest, epsilon) in [
            (named("bf16"), half::bf16::MAX.to_f64(), half::bf16::MIN_POSITIVE.to_f64(), half::bf16::EPSILON.to_f64()),
            (named("fp16"), half::f16::MAX.to_f64(), half::f16::MIN_POSITIVE.to_f64(), half::f16::EPSILON.to_f64()),
        ] {
            assert_eq!(format.bits(), 16);
            assert_eq!(format.largest(), largest, "{}'s largest", format.name);
            assert_eq!(format.smallest_normal(), smallest, "{}'s smallest normal", format.name);
            assert_eq!(format.epsilon(), epsilon, "{}'s epsilon", format.name);
        }
    }

    #[test]
    fn numbers_read_as_the_chapter_writes_them() {
        assert_eq!(scientific(65504.0), "65,504");
        assert_eq!(scientific(f64::from(f32::MAX)), "3.40 × 10³⁸");
        assert_eq!(scientific(2f64.powi(-7)), "7.81 × 10⁻³");
        assert_eq!(superscript(-10), "⁻¹⁰");
    }
}
