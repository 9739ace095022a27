//! What the host machine has: the memory available to a new allocation, as Linux reports it.
//! Low in the layering (nothing here imports the crate), so the engine, the benchmarks and the
//! config checks can all ask.

/// `MemAvailable` of `/proc/meminfo` in bytes: free memory plus what the kernel can reclaim
/// without swapping (page cache, reclaimable slabs). `None` where there is no such line (not
/// Linux, or a kernel before 3.14).
pub fn available_memory_bytes() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

/// The `MemAvailable:` line of a `/proc/meminfo` text, in bytes (the file says kB and means KiB).
fn parse_mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: usize = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") | None => kib.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_mem_available_line() {
        let text = "MemTotal:       24576000 kB\nMemFree:          100000 kB\nMemAvailable:   12345678 kB\nBuffers: 1 kB\n";
        assert_eq!(parse_mem_available(text), Some(12_345_678 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 5 MB\n"), None);
    }

    #[test]
    fn this_machine_reports_some_memory() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(available_memory_bytes().is_some_and(|b| b > 0));
        }
    }
}
