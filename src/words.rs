//! Counts in words, for what the programs print: "1 step", "600 steps".

/// `n` of `thing` (a singular noun), in words: "1 step", "2 steps", "4
/// micro-batches".
pub fn count(n: usize, thing: &str) -> String {
    let plural = match n {
        1 => "",
        _ if ["s", "x", "z", "ch", "sh"].iter().any(|end| thing.ends_with(end)) => "es",
        _ => "s",
    };
    format!("{n} {thing}{plural}")
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn one_thing_is_singular_and_any_other_number_plural() {
        assert_eq!(count(1, "step"), "1 step");
        assert_eq!(count(0, "step"), "0 steps");
        assert_eq!(count(600, "step"), "600 steps");
        assert_eq!(count(1, "micro-batch"), "1 micro-batch");
        assert_eq!(count(4, "micro-batch"), "4 micro-batches");
    }
}
