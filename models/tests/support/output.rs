//! Reading the binaries' output in tests.

/// The first number after `key` in `text` (a panic naming both when `key` is absent).
pub fn number_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no `{key}` in {text}"))
        + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
