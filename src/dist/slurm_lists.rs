//! Slurm's compressed lists, as `srun` sets them: host lists (`SLURM_JOB_NODELIST=gpu-[01-04,07],
//! login1`) and per-node task counts (`SLURM_TASKS_PER_NODE=8(x2),7`). [`super::launch`] needs the
//! first host (rank 0's) and this node's count, so only those are decoded; the rest of a host list
//! is checked for balanced brackets.

use anyhow::{bail, Result};

/// The first host of a Slurm host list: `gpu-[01-04,07],login1` -> `gpu-01`,
/// `rack[1-2]-n[08-09]` -> `rack1-n08` (zero padding kept as written).
pub(super) fn first_host(list: &str) -> Result<String> {
    let list = list.trim();
    let mut host = String::new();
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let mut group = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == ']' {
                        closed = true;
                        break;
                    }
                    group.push(c);
                }
                if !closed {
                    bail!("host list `{list}`: unbalanced brackets");
                }
                host.push_str(&first_of_range_group(list, &group)?);
            }
            ']' => bail!("host list `{list}`: `]` without `[`"),
            c if c.is_whitespace() => bail!("host list `{list}`: a space in a host name"),
            c => host.push(c),
        }
    }
    // The rest of the list must at least have balanced brackets.
    let mut open = false;
    for c in chars {
        match c {
            '[' if !open => open = true,
            ']' if open => open = false,
            '[' | ']' => bail!("host list `{list}`: unbalanced brackets"),
            _ => {}
        }
    }
    if open {
        bail!("host list `{list}`: unbalanced brackets");
    }
    if host.is_empty() {
        bail!("host list `{list}` has no first host");
    }
    Ok(host)
}

/// The first value of a bracket group `01-04,07`: `01`.
fn first_of_range_group(list: &str, group: &str) -> Result<String> {
    let first = group.split(',').next().unwrap_or("");
    let (lo, hi) = first.split_once('-').unwrap_or((first, first));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(lo) || !digits(hi) || group.contains('[') {
        bail!("host list `{list}`: `[{group}]` is not a list of numbers and ranges");
    }
    let value = |s: &str| s.parse::<u64>().ok();
    if value(lo) > value(hi) || value(lo).is_none() {
        bail!("host list `{list}`: the range `{first}` runs backwards");
    }
    Ok(lo.to_string())
}

/// Tasks on node `node` from Slurm's per-node counts: `8(x2),7` is 8, 8, 7.
pub(super) fn tasks_on_node(spec: &str, node: usize) -> Result<usize> {
    let mut first_node = 0usize;
    for item in spec.split(',') {
        let (count, repeat) = match item.trim().split_once("(x") {
            Some((count, rest)) => match rest.strip_suffix(')') {
                Some(repeat) => (count, repeat),
                None => bail!("`{item}` is not COUNT or COUNT(xREPEAT)"),
            },
            None => (item.trim(), "1"),
        };
        let (Ok(count), Ok(repeat)) = (count.parse::<usize>(), repeat.parse::<usize>()) else {
            bail!("`{item}` is not COUNT or COUNT(xREPEAT)");
        };
        first_node += repeat;
        if node < first_node {
            return Ok(count);
        }
    }
    bail!("no task count for node {node} (the list covers {first_node} nodes)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_host_lists() {
        for (list, first) in [
            ("gpu-[01-04,07],login1", "gpu-01"),
            ("login1,gpu-[01-04]", "login1"),
            ("gpu-[07,01-04]", "gpu-07"),
            ("rack[1-2]-n[08-09],x", "rack1-n08"),
            ("n[007]", "n007"),
            ("[3-4]a", "3a"),
            ("node12", "node12"),
            (" node12 ", "node12"),
            ("10.0.0.[1-4]", "10.0.0.1"),
        ] {
            assert_eq!(first_host(list).unwrap(), first, "{list}");
        }
        for (list, expected) in [
            ("", "no first host"),
            (",a", "no first host"),
            ("gpu-[01-04", "unbalanced"),
            ("gpu-01]", "`]` without `[`"),
            ("a,b[1-2", "unbalanced"),
            ("a,b]", "unbalanced"),
            ("gpu-[]", "not a list of numbers"),
            ("gpu-[a-c]", "not a list of numbers"),
            ("gpu-[1-]", "not a list of numbers"),
            ("gpu-[04-01]", "runs backwards"),
            ("gpu-[1-[2]]", "not a list of numbers"),
            ("gpu 1", "a space"),
        ] {
            let message = format!("{:#}", first_host(list).unwrap_err());
            assert!(message.contains(expected), "{list}: {message}");
        }
    }

    #[test]
    fn slurm_tasks_per_node() {
        assert_eq!(tasks_on_node("8(x2),7", 0).unwrap(), 8);
        assert_eq!(tasks_on_node("8(x2),7", 1).unwrap(), 8);
        assert_eq!(tasks_on_node("8(x2),7", 2).unwrap(), 7);
        assert_eq!(tasks_on_node("1", 0).unwrap(), 1);
        assert!(tasks_on_node("8(x2),7", 3).is_err());
        assert!(tasks_on_node("8(x2", 0).is_err());
        assert!(tasks_on_node("eight", 0).is_err());
    }
}
