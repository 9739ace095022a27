//! Every config file in `examples/` parses against this CLI: every key a flag of its command,
//! every value of the flag's type and accepted by its parser. Each file names its command in a
//! comment line that runs it (`#   swerve-train rl --config examples/toy.toml`); that line is
//! parsed as it stands, with the file. A `swerve-serve` file (`#   swerve-serve --config ...`)
//! is tests/config_file.rs's.

use super::{fill_computed_defaults, Cli, CONFIG};
use std::path::Path;

#[test]
fn every_example_config_parses_against_the_cli() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let mention = format!("--config examples/{name}");
        let line = text
            .lines()
            .find(|l| l.starts_with('#') && l.contains(&mention))
            .unwrap_or_else(|| panic!("{name}: no comment line running it ({mention})"));
        if line.contains("swerve-serve ") {
            continue;
        }
        let words = line.trim_start_matches('#').split_whitespace();
        let args = words.map(|w| {
            if w == format!("examples/{name}") {
                path.clone().into_os_string()
            } else {
                w.into()
            }
        });
        let parsed = swerve::cli::try_parse::<Cli>(&CONFIG, args.collect())
            .unwrap_or_else(|e| panic!("{name}: `{line}`: {e:#}"));
        let mut resolved = parsed.resolved.expect("a command that takes --config");
        fill_computed_defaults(&mut resolved, &parsed.cli.command).unwrap();
        checked.push(name);
    }
    checked.sort();
    for wanted in ["toy.toml", "qwen72b-stage1.toml", "qwen72b-stage2.toml"] {
        assert!(checked.iter().any(|c| c == wanted), "{wanted}: {checked:?}");
    }
}
