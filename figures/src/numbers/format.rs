//! How the guide writes a number: thousands separated by commas (`4,182`),
//! ratios with a times sign (`0.96×`), shares as whole percents.

/// `value` with `decimals` places and its thousands separated: `10,356`, `1,234.5`.
pub fn grouped(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    let (whole, fraction) = text.split_once('.').map_or((text.as_str(), None), |(w, f)| (w, Some(f)));
    let (sign, digits) = whole.strip_prefix('-').map_or(("", whole), |d| ("-", d));
    let mut out = String::from(sign);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if let Some(fraction) = fraction {
        out.push('.');
        out.push_str(fraction);
    }
    out
}

/// A speed or size ratio: `0.96×`; from 10 on, whole: `13×`.
pub fn ratio(value: f64) -> String {
    if value >= 10.0 {
        format!("{value:.0}×")
    } else {
        format!("{value:.2}×")
    }
}

/// A fraction as a percent with `decimals` places: 0.538 is `54%`.
pub fn percent(fraction: f64, decimals: usize) -> String {
    format!("{:.decimals$}%", fraction * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated_and_decimals_kept() {
        assert_eq!(grouped(4182.0, 0), "4,182");
        assert_eq!(grouped(999.4, 0), "999");
        assert_eq!(grouped(1234567.891, 1), "1,234,567.9");
        assert_eq!(grouped(-10356.0, 0), "-10,356");
        assert_eq!(grouped(0.254, 2), "0.25");
    }

    #[test]
    fn ratios_and_percents_read_as_the_guide_writes_them() {
        assert_eq!(ratio(0.9612), "0.96×");
        assert_eq!(ratio(13.219), "13×");
        assert_eq!(percent(0.538, 0), "54%");
        assert_eq!(percent(0.2951, 1), "29.5%");
    }
}
