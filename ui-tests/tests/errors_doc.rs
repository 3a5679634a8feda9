//! docs/errors.md shows the compile-time errors as the ui cases pin them: after each
//! `<!-- ui: NAME -->` line the page holds `tests/ui/fail/NAME.rs` and its exact
//! `NAME.stderr`, generated here. The test fails where the page differs from what it
//! generates, so the page cannot go stale; `KILN_BLESS=1` writes it.

use std::path::Path;

/// The marker that a section shows a ui case.
const MARKER: (&str, &str) = ("<!-- ui: ", " -->");

/// A case's source as the page shows it: without `fn main() {}`, and for a `#[model]`
/// case without the prelude's `use` (every case has it), blank runs collapsed.
fn shown_source(source: &str) -> String {
    let is_model = source.lines().any(|l| l.starts_with("#[model]"));
    let mut lines: Vec<&str> = Vec::new();
    for line in source.lines() {
        let dropped = line == "fn main() {}" || (is_model && line == "use kiln::prelude::*;");
        let blank_again =
            line.trim().is_empty() && lines.last().is_none_or(|l| l.trim().is_empty());
        if !dropped && !blank_again {
            lines.push(line);
        }
    }
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    lines.join("\n")
}

/// The page with every marked section's code and error generated from its case, and
/// the count of cases brought up to date.
fn generated(page: &str, cases: &Path) -> String {
    let mut out = String::new();
    let mut lines = page.lines().peekable();
    while let Some(line) = lines.next() {
        out += line;
        out += "\n";
        let Some(name) = line
            .strip_prefix(MARKER.0)
            .and_then(|rest| rest.strip_suffix(MARKER.1))
        else {
            continue;
        };
        let read = |ext: &str| {
            let path = cases.join(format!("{name}.{ext}"));
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("docs/errors.md shows `{}`: {e}", path.display()))
        };
        let (source, stderr) = (read("rs"), read("stderr"));
        out += &format!(
            "```rust\n{}\n```\n\n```text\n{}\n```\n",
            shown_source(&source),
            stderr.trim_end()
        );
        // What the section held before, up to the next section, is replaced.
        while lines.peek().is_some_and(|l| !l.starts_with("## ")) {
            lines.next();
        }
        if lines.peek().is_some() {
            out += "\n";
        }
    }
    let count = std::fs::read_dir(cases)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "rs"))
        })
        .count();
    with_count(&out, count)
}

/// `page` with its "(N cases in all" saying `count`.
fn with_count(page: &str, count: usize) -> String {
    const AFTER: &str = " cases in all";
    let Some(end) = page.find(AFTER) else {
        return page.to_string();
    };
    let start = page[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    format!("{}{count}{}", &page[..start], &page[end..])
}

#[test]
fn errors_md_shows_each_case_as_its_stderr_pins_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page_path = root.join("../docs/errors.md");
    let page = std::fs::read_to_string(&page_path).unwrap();
    let want = generated(&page, &root.join("tests/ui/fail"));
    assert!(
        want.matches(MARKER.0).count() >= 10,
        "the page shows the cases"
    );
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&page_path, &want).unwrap();
        return;
    }
    if page != want {
        let line = page
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map_or(page.lines().count().min(want.lines().count()), |i| i);
        panic!(
            "docs/errors.md differs from its ui cases from line {}: regenerate it with \
             `KILN_BLESS=1 cargo test -p kiln-ui-tests --test errors_doc`",
            line + 1
        );
    }
}
