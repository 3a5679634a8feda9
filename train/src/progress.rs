//! A training run's progress: indicatif's bar where stderr is a terminal; elsewhere (a
//! log file, a pipe, a batch system) plain lines on stdout, one every twentieth of the
//! run or every 30 seconds, whichever comes first, so a log shows the run moving
//! instead of staying silent for an epoch.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a log goes without a progress line.
const LINE_EVERY: Duration = Duration::from_secs(30);

/// Progress through `total` steps, drawn as a bar or written as lines (see the module).
pub struct Progress {
    bar: ProgressBar,
    lines: Option<Mutex<Lines>>,
}

/// What the plain lines need: where the run is and when the last line went out.
struct Lines {
    total: u64,
    position: u64,
    /// The position the run started from.
    first: u64,
    message: String,
    started: Instant,
    printed_at: Instant,
    printed_position: u64,
}

impl Progress {
    /// Progress through `total` steps, shown when `visible` (a data-parallel run's
    /// rank 0) and hidden otherwise.
    pub fn new(total: u64, visible: bool) -> Progress {
        if !visible {
            return Progress {
                bar: ProgressBar::hidden(),
                lines: None,
            };
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
                )
                .expect("static template"),
            );
            return Progress { bar, lines: None };
        }
        let now = Instant::now();
        Progress {
            bar: ProgressBar::hidden(),
            lines: Some(Mutex::new(Lines {
                total,
                position: 0,
                first: 0,
                message: String::new(),
                started: now,
                printed_at: now,
                printed_position: 0,
            })),
        }
    }

    /// Where the run starts (a resumed run's step).
    pub fn set_position(&self, position: u64) {
        self.bar.set_position(position);
        self.with_lines(|l| {
            l.position = position;
            l.first = position;
            l.printed_position = position;
        });
    }

    /// The message shown beside the position (the loss, the throughput).
    pub fn set_message(&self, message: String) {
        self.with_lines(|l| l.message.clone_from(&message));
        self.bar.set_message(message);
    }

    /// One more step done; a line goes out when one is due.
    pub fn inc(&self, steps: u64) {
        self.bar.inc(steps);
        self.with_lines(|l| {
            l.position += steps;
            let stride = (l.total / 20).max(1);
            let due = l.position - l.printed_position >= stride
                || l.printed_at.elapsed() >= LINE_EVERY
                || l.position == l.total;
            if due && l.position > l.printed_position {
                let elapsed = l.started.elapsed().as_secs_f64();
                // The time left at the pace of this run's own steps (a resumed run
                // starts its clock at its first step).
                let done = l.position - l.first;
                let left = match done {
                    0 => String::new(),
                    _ => {
                        let secs = elapsed * (l.total - l.position) as f64 / done as f64;
                        format!(", {secs:.0} s left")
                    }
                };
                println!(
                    "step {}/{} ({:.0}%) {} [{elapsed:.0} s{left}]",
                    l.position,
                    l.total,
                    100.0 * l.position as f64 / l.total.max(1) as f64,
                    l.message
                );
                l.printed_at = Instant::now();
                l.printed_position = l.position;
            }
        });
    }

    /// Prints `line` on standard output with the bar out of its way.
    pub fn println(&self, line: &str) {
        self.bar.suspend(|| println!("{line}"));
    }

    /// Runs `f` (which prints) with the bar out of its way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Clears the bar at the run's end.
    pub fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
    }

    fn with_lines(&self, f: impl FnOnce(&mut Lines)) {
        if let Some(lines) = &self.lines {
            f(&mut lines.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}
