//! HTML text for the report: escaping (every character that comes from the data goes through
//! [`escape`]: agent output is hostile), long text cut for display with the whole behind a
//! `<details>`, and the page frame with its stylesheet.
//!
//! ```text
//!   long text ──► fits (≤ DISPLAY_BYTES, ≤ DISPLAY_LINES) ──► <pre>all</pre>
//!             └─► else ─► <pre>head
//!                           [report: N bytes in M lines not shown here: the whole text is below]
//!                           tail</pre>
//!                         <details><summary>whole text (B bytes)</summary><pre>all</pre></details>
//! ```

/// Most bytes of one text shown before it is cut for display.
pub const DISPLAY_BYTES: usize = 6 * 1024;
/// Most lines of one text shown before it is cut for display.
pub const DISPLAY_LINES: usize = 120;

/// What marks a page as written by the report (a folder holding one may be written over).
pub const GENERATOR: &str = "swerve-train report";

/// `text` safe as HTML element content and as a quoted attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // NUL is not allowed in HTML text: shown as the two characters `\0`.
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// `n` with thousands separators: 12,345.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The smallest char boundary of `text` at or above `at`.
fn ceil_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Where a long text is cut for display: its first `head` bytes and its bytes from `tail` on
/// are shown. `None`: it is short enough to show whole.
pub fn display_cut(text: &str) -> Option<(usize, usize)> {
    let lines = text.lines().count();
    if text.len() <= DISPLAY_BYTES && lines <= DISPLAY_LINES {
        return None;
    }
    // A third of the budget from the end (where errors and results usually are), the rest from
    // the start; each part also at most its share of lines.
    let head_budget = DISPLAY_BYTES * 2 / 3;
    let tail_budget = DISPLAY_BYTES - head_budget;
    let mut head = floor_boundary(text, head_budget);
    if let Some((i, _)) = text[..head].match_indices('\n').nth(DISPLAY_LINES * 2 / 3) {
        head = i + 1;
    }
    let mut tail = ceil_boundary(text, text.len().saturating_sub(tail_budget));
    if let Some((i, _)) = text[tail..].rmatch_indices('\n').nth(DISPLAY_LINES / 3) {
        tail += i + 1;
    }
    Some((head, tail.max(head)))
}

/// `text` in a `<pre class="{class}">`, cut for display when long (see the module's diagram):
/// the cut part is named by its size, and the whole text follows in a closed `<details>`.
/// `mark` turns escaped text into the HTML shown (highlighting, or `escape` alone).
pub fn long_text_with(text: &str, class: &str, mark: &dyn Fn(&str) -> String) -> String {
    let class = escape(class);
    match display_cut(text) {
        None => format!("<pre class=\"{class}\">{}</pre>", pre_content(mark(text))),
        Some((head, tail)) => {
            let hidden = &text[head..tail];
            format!(
                "<pre class=\"{class}\">{}<span class=\"report-cut\">[report: {} bytes in {} lines \
                 not shown here: the whole text is below]</span>\n{}</pre>\n<details class=\"whole\">\
                 <summary>whole text ({} bytes)</summary><pre class=\"{class}\">{}</pre></details>",
                pre_content(mark(&text[..head])),
                thousands(hidden.len()),
                thousands(hidden.lines().count().max(1)),
                mark(&text[tail..]),
                thousands(text.len()),
                pre_content(mark(text))
            )
        }
    }
}

/// `html` as the start of a `<pre>`'s content: HTML drops one newline right after `<pre>`, so
/// a text that starts with one gets another, and shows as it is.
fn pre_content(html: String) -> String {
    if html.starts_with('\n') {
        format!("\n{html}")
    } else {
        html
    }
}

/// [`long_text_with`] with plain escaping.
pub fn long_text(text: &str, class: &str) -> String {
    long_text_with(text, class, &escape)
}

/// A whole page: `title` (escaped here) and `body` (HTML already), with the stylesheet inline,
/// so every page stands alone.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"generator\" content=\"{GENERATOR}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n",
        escape(title),
        STYLE
    )
}

/// The report's stylesheet (no script anywhere).
const STYLE: &str = include_str!("style.css");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        let hostile = "<script>alert('x')</script></details></pre><!-- & \"q\" \0";
        let escaped = escape(hostile);
        assert_eq!(
            escaped,
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;/details&gt;&lt;/pre&gt;\
             &lt;!-- &amp; &quot;q&quot; \\0"
        );
        for c in ['<', '>', '"', '\''] {
            assert!(!escaped.contains(c), "{c} left in {escaped}");
        }
        // Every & starts an entity the escaper wrote.
        for (i, _) in escaped.match_indices('&') {
            let rest = &escaped[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                    .iter()
                    .any(|e| rest.starts_with(e)),
                "{rest}"
            );
        }
        assert_eq!(escape("plain é 中文"), "plain é 中文");
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn short_text_is_shown_whole() {
        let html = long_text("a < b\nline two", "obs");
        assert_eq!(html, "<pre class=\"obs\">a &lt; b\nline two</pre>");
        assert!(display_cut(&"x".repeat(DISPLAY_BYTES)).is_none());
        // HTML drops a newline right after <pre>: a text that starts with one keeps it.
        assert_eq!(long_text("\nx", "t"), "<pre class=\"t\">\n\nx</pre>");
    }

    #[test]
    fn long_text_is_cut_with_its_size_and_kept_whole_behind_details() {
        // Bytes: one long line of multi-byte characters, cut on char boundaries.
        let text = "é".repeat(DISPLAY_BYTES);
        let (head, tail) = display_cut(&text).unwrap();
        assert!(text.is_char_boundary(head) && text.is_char_boundary(tail));
        assert!(head + (text.len() - tail) <= DISPLAY_BYTES + 2);
        let html = long_text(&text, "obs");
        let marker = format!(
            "[report: {} bytes in 1 lines not shown here",
            thousands(tail - head)
        );
        assert!(html.contains(&marker), "{}", &html[..200]);
        assert!(html.contains(&format!("whole text ({} bytes)", thousands(text.len()))));
        assert!(html.contains(&format!("<pre class=\"obs\">{text}</pre></details>")));
        // Lines: many short lines, cut at line starts.
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let (head, tail) = display_cut(&text).unwrap();
        assert!(text[..head].ends_with('\n') && text[..tail].ends_with('\n'));
        let shown = text[..head].lines().count() + text[tail..].lines().count();
        assert!(shown <= DISPLAY_LINES + 2, "{shown}");
        let html = long_text(&text, "obs");
        assert!(html.contains("line 0\n") && html.contains("line 999\n"));
        assert!(html.contains(&format!(
            "in {} lines not shown here",
            thousands(text[head..tail].lines().count())
        )));
    }

    #[test]
    fn a_cut_hostile_text_stays_escaped_in_both_parts() {
        let text = format!(
            "{}</details><script>x</script>{}",
            "a\n".repeat(DISPLAY_LINES),
            "b\n".repeat(DISPLAY_LINES)
        );
        let html = long_text(&text, "obs");
        assert!(!html.contains("<script>") && !html.contains("x</script>"));
        // The only </details> is the report's own.
        assert_eq!(html.matches("</details>").count(), 1);
        assert!(html.contains("&lt;/details&gt;&lt;script&gt;"));
    }

    #[test]
    fn the_page_escapes_its_title_and_carries_no_script() {
        let html = page("<b>t</b>", "<p>body</p>");
        assert!(html.contains("<title>&lt;b&gt;t&lt;/b&gt;</title>"));
        assert!(html.contains(GENERATOR));
        assert!(!html.to_lowercase().contains("<script"));
    }
}
