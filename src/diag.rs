//! Diagnostics of programs relaxc reads as text (TVMScript, the `.rvmasm` form): a source span,
//! an error at a span, and its rendering with the source line underlined (ariadne). The front
//! ends and lowering report errors with these.

use std::fmt;

/// A byte range of the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end: end.max(start) }
    }
    /// From the start of self to the end of other.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// An error in a program, at a span of its source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    pub span: Span,
    pub message: String,
}

impl SourceError {
    pub fn new(span: Span, message: impl Into<String>) -> SourceError {
        SourceError { span, message: message.into() }
    }

    /// `file:line:col: message`, then the source line with the span underlined.
    pub fn render(&self, file: &str, src: &str) -> String {
        let mut out = Vec::new();
        let start = self.span.start.min(src.len());
        let end = self.span.end.min(src.len()).max(start);
        let (line, col) = line_col(src, start);
        let report = ariadne::Report::build(ariadne::ReportKind::Error, (file, start..end))
            .with_config(ariadne::Config::default().with_color(false))
            .with_message(format!("{file}:{line}:{col}: {}", self.message))
            .with_label(ariadne::Label::new((file, start..end)).with_message(&self.message))
            .finish();
        if report.write((file, ariadne::Source::from(src)), &mut out).is_err() {
            return format!("{file}:{line}:{col}: {}", self.message);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// 1-based line and column of a byte offset.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.chars().count(), |nl| before[nl + 1..].chars().count()) + 1;
    (line, col)
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}
