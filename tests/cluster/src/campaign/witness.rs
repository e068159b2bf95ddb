//! No acknowledged write lost, and the workload alive, judged against an
//! outside witness.
//!
//! Each writer and sharer appends a record (`<seq> <incarnation>`) to its
//! file on the volume, fsyncs it, and only then tells the witness: a line
//! `<seq> <incarnation> <unix time>` in a file of its own below
//! [`WITNESS_ROOT`], a host folder (shared by every node's mount
//! namespace) that no fault touches. A record the witness holds was
//! acknowledged. After every step each file must hold every record its
//! witness holds, in order, none written again by another incarnation
//! (a writer resuming below what it had acknowledged: its tail was lost),
//! no gap; and every writer must have acknowledged new records since the
//! cluster converged. A sample of one number before a step, compared with
//! the last line after it, saw none of this: a lost tail is written again
//! before anyone looks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use super::{Campaign, Invariant};
use crate::{ClusterError, Result};

/// The host folder of the witnesses (one folder per campaign namespace,
/// mounted into the workload's pods at `/witness`).
pub const WITNESS_ROOT: &str = "/var/lib/csi-campaign-witness";

/// How long a writer may take to show it is alive once the cluster
/// converged: it acknowledges a record every 0.2 s when it can.
const ALIVE_WITHIN: Duration = Duration::from_secs(60);

/// The workload's loop, as a shell script for `sh -c`: `$f` the file on
/// the volume, `$w` its witness. It resumes after the last whole record
/// of its file (a crash may leave a torn line, or zeros), starts on a
/// line of its own, and counts a record only once it is fsynced.
pub const WORKLOAD_LOOP: &str = r#"inc=$(cut -c1-8 /proc/sys/kernel/random/uuid)
touch "$f" && echo >> "$f"
i=$(tr -d '\000' < "$f" | awk 'NF == 2 && $1 ~ /^[0-9]+$/ { v = $1 } END { print v + 0 }')
while true; do
  n=$((i + 1))
  if echo "$n $inc" >> "$f" && sync "$f"; then
    i=$n
    echo "$n $inc $(date +%s)" >> "$w" && sync "$w"
  fi
  sleep 0.2
done
"#;

/// One acknowledged record, as the witness holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witnessed {
    pub seq: u64,
    pub incarnation: String,
    pub at: u64,
}

/// The witness's whole lines (a torn last line was never acknowledged).
pub fn parse_witness(text: &str) -> Vec<Witnessed> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (seq, incarnation, at) = (f.next()?, f.next()?, f.next()?);
            Some(Witnessed {
                seq: seq.parse().ok()?,
                incarnation: incarnation.to_string(),
                at: at.parse().ok()?,
            })
        })
        .collect()
}

/// The file's whole records, in order (zeros and torn or empty lines
/// left out).
fn parse_records(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_matches('\0');
            let mut f = l.split_whitespace();
            let (seq, incarnation) = (f.next()?, f.next()?);
            f.next().is_none().then_some(())?;
            Some((seq.parse().ok()?, incarnation.to_string()))
        })
        .collect()
}

/// The shell that prints a file whole and says how much that was: its
/// size when the read began, then exactly that many bytes (the file is
/// appended to meanwhile), then a line naming the count. `kubectl exec`
/// can end its output early and still exit 0 (kubernetes/kubernetes
/// #124571); a cut read of a sharer's file looked like 1735 lost records
/// in a run of the test command. What `unframed` cannot match was not
/// read whole.
pub fn framed_read(path: &str) -> String {
    format!(
        "f={path}; s=$(stat -c %s \"$f\") && head -c \"$s\" \"$f\" && printf '\\n{FRAME_END} %s\\n' \"$s\""
    )
}

/// What ends a [`framed_read`]'s output, before the byte count.
const FRAME_END: &str = "--- end of the file, bytes:";

/// The file from a [`framed_read`]'s output, if it arrived whole: `None`
/// when the count is missing or the bytes before it are not that many.
pub fn unframed(output: &str) -> Option<&str> {
    let body = output.strip_suffix('\n')?;
    let (data, count) = body.rsplit_once(&format!("\n{FRAME_END} "))?;
    (count.parse::<usize>().ok()? == data.len()).then_some(data)
}

/// A list of numbers, short: the count and the first few.
fn some(seqs: &[u64]) -> String {
    let shown: Vec<String> = seqs.iter().take(5).map(u64::to_string).collect();
    let more = if seqs.len() > 5 { ", ..." } else { "" };
    format!("{} ({}{more})", seqs.len(), shown.join(", "))
}

/// What `data` (the file as it is now) breaks of what its witness
/// acknowledged: records missing, written again by another incarnation,
/// out of order; and gaps in the file's own numbering.
pub fn acknowledged_lost(what: &str, witnessed: &[Witnessed], data: &str) -> Vec<String> {
    let records = parse_records(data);
    let held: HashSet<(u64, &str)> = records.iter().map(|(s, i)| (*s, i.as_str())).collect();
    let acknowledged: HashMap<u64, &str> = witnessed
        .iter()
        .map(|w| (w.seq, w.incarnation.as_str()))
        .collect();
    let mut found = Vec::new();
    let mut by_seq: HashMap<u64, HashSet<&str>> = HashMap::new();
    for w in witnessed {
        by_seq.entry(w.seq).or_default().insert(&w.incarnation);
    }
    let mut twice: Vec<u64> = by_seq
        .iter()
        .filter(|(_, i)| i.len() > 1)
        .map(|(s, _)| *s)
        .collect();
    twice.sort_unstable();
    if !twice.is_empty() {
        found.push(format!(
            "{what}: numbers acknowledged by two incarnations (two writers, or one resumed below what it had acknowledged): {}",
            some(&twice)
        ));
    }
    let missing: Vec<u64> = witnessed
        .iter()
        .filter(|w| !held.contains(&(w.seq, w.incarnation.as_str())))
        .map(|w| w.seq)
        .collect();
    if !missing.is_empty() {
        found.push(format!(
            "{what}: acknowledged records missing from the file: {}",
            some(&missing)
        ));
    }
    let rewritten: Vec<u64> = records
        .iter()
        .filter(|(s, i)| acknowledged.get(s).is_some_and(|a| a != i))
        .map(|(s, _)| *s)
        .collect();
    if !rewritten.is_empty() {
        found.push(format!(
            "{what}: acknowledged numbers written again by another incarnation: {}",
            some(&rewritten)
        ));
    }
    // in order: the acknowledged records the file holds come in their
    // numbers' order (the same record twice is a write retried after its
    // fsync failed)
    let mut last: Option<(u64, &str)> = None;
    let mut disordered = Vec::new();
    for (s, i) in &records {
        if acknowledged.get(s) != Some(&i.as_str()) {
            continue;
        }
        if let Some((ls, li)) = last
            && (*s < ls || (*s == ls && li != i))
        {
            disordered.push(*s);
        }
        last = Some((*s, i.as_str()));
    }
    if !disordered.is_empty() {
        found.push(format!(
            "{what}: acknowledged records out of order: {}",
            some(&disordered)
        ));
    }
    // no gap: each record numbered as the one before or the next
    let gaps: Vec<String> = records
        .windows(2)
        .filter(|w| w[1].0 > w[0].0 + 1)
        .map(|w| format!("{}..{}", w[0].0, w[1].0))
        .collect();
    if !gaps.is_empty() {
        found.push(format!(
            "{what}: the file skips numbers: {} ({})",
            gaps.len(),
            gaps.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    found
}

/// Whether a witness acknowledged anything in a second after `since`
/// (times are whole seconds: a record of the check's first second may
/// predate it, as a writer's last before its filesystem went read-only
/// did in a run of the test command).
pub fn alive_since(witnessed: &[Witnessed], since: u64) -> bool {
    witnessed.iter().any(|w| w.at > since)
}

impl Campaign {
    /// The campaign's witness folder on the host.
    pub fn witness_dir(&self) -> PathBuf {
        PathBuf::from(WITNESS_ROOT).join(self.n())
    }

    /// Every witness, by the name of what it witnessed (a writer's pod,
    /// whose claim is `data-<pod>`, or a sharer's file).
    pub fn witnesses(&self) -> Result<BTreeMap<String, Vec<Witnessed>>> {
        let dir = self.witness_dir();
        let mut all = BTreeMap::new();
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", dir.display())))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| ClusterError::Other(format!("{}: {e}", dir.display())))?;
            let text = std::fs::read(entry.path())
                .map_err(|e| ClusterError::Other(format!("{}: {e}", entry.path().display())))?;
            all.insert(
                entry.file_name().to_string_lossy().into_owned(),
                parse_witness(&String::from_utf8_lossy(&text)),
            );
        }
        Ok(all)
    }

    /// A file of the workload as it is now: a writer's from its pod, a
    /// sharer's from any sharer (they share the claim). A read is tried
    /// again, from every sharer, for half a minute: `kubectl exec` over
    /// websockets sometimes ends a stream early, with an error ("Unknown
    /// stream id … closed all streams", the test command's run of
    /// 7c179cf) or without one ([`framed_read`]), and a reader's broken
    /// stream says nothing of the file. A file no reader
    /// could give in that time is the caller's to report.
    async fn workload_file(&self, name: &str) -> Result<String> {
        const ATTEMPTS: u32 = 6;
        let mut errors = Vec::new();
        for attempt in 1..=ATTEMPTS {
            let readers: Vec<(String, String)> = if name.starts_with("writer-") {
                vec![(name.to_string(), framed_read("/data/seq"))]
            } else {
                self.pods("sharer")
                    .await?
                    .iter()
                    .filter_map(|p| p["metadata"]["name"].as_str())
                    .map(|pod| (pod.to_string(), framed_read(&format!("/data/{name}"))))
                    .collect()
            };
            if readers.is_empty() {
                errors.push(format!("attempt {attempt}: no sharer to read the share"));
            }
            for (pod, script) in &readers {
                match self.c.exec(self.n(), pod, script).await {
                    Ok(output) => match unframed(&output) {
                        Some(data) => return Ok(data.to_string()),
                        None => errors.push(format!(
                            "attempt {attempt} from {pod}: the read ended early ({} bytes, no byte count or another one at its end)",
                            output.len()
                        )),
                    },
                    Err(e) => errors.push(format!("attempt {attempt} from {pod}: {e}")),
                }
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
        let last = errors.pop().unwrap_or_default();
        Err(ClusterError::Other(format!(
            "{} reads failed in {ATTEMPTS} attempts, the last {last}",
            errors.len() + 1
        )))
    }

    /// No acknowledged write lost: each witness against its file. The
    /// witnesses are read first: whatever they hold was in the files
    /// before they were read.
    pub async fn check_acknowledged(&self, label: &str) -> Result<Vec<String>> {
        let witnesses = self.witnesses()?;
        let mut found = Vec::new();
        for (name, witnessed) in &witnesses {
            // a file that cannot be read (its pod not running: the step
            // did not converge) is reported, never the campaign's end
            let data = match self.workload_file(name).await {
                Ok(data) => data,
                Err(e) => {
                    found.push(format!(
                        "{:?} at {label}: {name}'s file cannot be read, {} acknowledged records unchecked: {e}",
                        Invariant::NoAcknowledgedWriteLost,
                        witnessed.len()
                    ));
                    continue;
                }
            };
            let lost = acknowledged_lost(name, witnessed, &data);
            // a shared file looks the same from every node, or one node's
            // client serves a view of its own: each sharer's, to tell
            let views = if lost.is_empty() || name.starts_with("writer-") {
                String::new()
            } else {
                format!("; {}", self.views_of_shared(name).await?)
            };
            for lost in lost {
                found.push(format!(
                    "{:?} at {label}: {lost}{views}",
                    Invariant::NoAcknowledgedWriteLost
                ));
            }
        }
        if witnesses.is_empty() {
            found.push(format!(
                "{:?} at {label}: the witness holds nothing (is the workload writing?)",
                Invariant::NoAcknowledgedWriteLost
            ));
        }
        Ok(found)
    }

    /// What each sharer reads of a shared file: its node, the file's
    /// size and last whole record as that pod sees them (or why it could
    /// not read it).
    async fn views_of_shared(&self, name: &str) -> Result<String> {
        let mut views = Vec::new();
        for p in self.pods("sharer").await? {
            let Some(pod) = p["metadata"]["name"].as_str() else {
                continue;
            };
            let node = p["spec"]["nodeName"].as_str().unwrap_or("no node");
            let view = match self
                .c
                .exec(self.n(), pod, &framed_read(&format!("/data/{name}")))
                .await
            {
                Ok(out) => match unframed(&out) {
                    Some(data) => {
                        let last = parse_records(data).last().map(|(s, _)| *s);
                        format!("{} bytes, last record {last:?}", data.len())
                    }
                    None => format!("a cut read ({} bytes)", out.len()),
                },
                Err(e) => format!("no read: {e}"),
            };
            views.push(format!("{pod} on {node}: {view}"));
        }
        Ok(format!("as each sharer reads it: {}", views.join("; ")))
    }

    /// The acknowledged records so far, all witnesses together.
    pub fn acknowledged_count(&self) -> Result<usize> {
        Ok(self.witnesses()?.values().map(Vec::len).sum())
    }

    /// The workload alive: every writer and sharer acknowledged a record
    /// after now, within [`ALIVE_WITHIN`]. A writer whose filesystem went
    /// read-only stays Ready, and converges; it does not write.
    pub async fn check_alive(&self, label: &str) -> Result<Vec<String>> {
        let since = super::now_secs();
        let mut names = Vec::new();
        for app in ["writer", "sharer"] {
            for p in self.pods(app).await? {
                if let Some(name) = p["metadata"]["name"].as_str() {
                    names.push(name.to_string());
                }
            }
        }
        // as long as the cluster has to catch up, at least 10 s (50
        // records' time) and at most a minute
        let within = self.catch_up.clamp(Duration::from_secs(10), ALIVE_WITHIN);
        let until = std::time::Instant::now() + within;
        loop {
            let witnesses = self.witnesses()?;
            let silent: Vec<&String> = names
                .iter()
                .filter(|n| !witnesses.get(*n).is_some_and(|w| alive_since(w, since)))
                .collect();
            if silent.is_empty() {
                return Ok(Vec::new());
            }
            if std::time::Instant::now() >= until {
                return Ok(silent
                    .into_iter()
                    .map(|n| {
                        let last = witnesses
                            .get(n)
                            .and_then(|w| w.last())
                            .map_or("never".to_string(), |w| format!("last at {}", w.at));
                        format!(
                            "{:?} at {label}: {n} acknowledged no write in the {} s after the cluster converged ({last})",
                            Invariant::WorkloadAlive,
                            within.as_secs()
                        )
                    })
                    .collect());
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn witness(seqs: std::ops::RangeInclusive<u64>, inc: &str) -> Vec<Witnessed> {
        seqs.map(|seq| Witnessed {
            seq,
            incarnation: inc.into(),
            at: 1000 + seq,
        })
        .collect()
    }

    fn file(parts: &[(std::ops::RangeInclusive<u64>, &str)]) -> String {
        let mut s = String::new();
        for (r, inc) in parts {
            for i in r.clone() {
                s.push_str(&format!("{i} {inc}\n"));
            }
        }
        s
    }

    #[test]
    fn a_file_holding_every_acknowledged_record_passes() {
        let w = witness(1..=200, "aa");
        assert!(acknowledged_lost("w", &w, &file(&[(1..=200, "aa")])).is_empty());
        // records written after the witness was read, and a record
        // written but never acknowledged (its writer killed first)
        assert!(
            acknowledged_lost("w", &w, &file(&[(1..=201, "aa"), (202..=210, "bb")])).is_empty()
        );
        // a torn line, zeros and an empty line where a writer died
        let torn = format!(
            "{}20\0\0\0\n\n{}",
            file(&[(1..=200, "aa")]),
            file(&[(201..=205, "bb")])
        );
        assert!(acknowledged_lost("w", &w, &torn).is_empty(), "{torn:?}");
        // a record retried after its fsync failed
        let retried = format!("{}200 aa\n", file(&[(1..=200, "aa")]));
        assert!(acknowledged_lost("w", &w, &retried).is_empty());
    }

    #[test]
    fn a_lost_tail_written_again_is_seen() {
        // the issue's case: the last 150 records cut, the writer resumed
        // from what was left (a new incarnation counting on from 50)
        let w = witness(1..=200, "aa");
        let found = acknowledged_lost("w", &w, &file(&[(1..=50, "aa"), (51..=220, "bb")]));
        assert!(
            found
                .iter()
                .any(|f| f.contains("missing") && f.contains("150 (51")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|f| f.contains("written again")),
            "{found:?}"
        );
        // the same writer going on after its file was cut under it
        let found = acknowledged_lost("w", &w, &file(&[(1..=50, "aa"), (201..=210, "aa")]));
        assert!(found.iter().any(|f| f.contains("missing")), "{found:?}");
        assert!(
            found
                .iter()
                .any(|f| f.contains("skips numbers: 1 (50..201)")),
            "{found:?}"
        );
        // a file rewound to 1, as the old check's test did
        assert!(!acknowledged_lost("w", &w, "1 cc\n").is_empty());
        assert!(
            !acknowledged_lost("w", &w, "").is_empty(),
            "an empty file lost them all"
        );
    }

    #[test]
    fn two_writers_interleaving_are_seen() {
        // an old incarnation still writing after its replacement started
        let mut w = witness(1..=10, "aa");
        w.extend(witness(11..=12, "bb"));
        w.push(Witnessed {
            seq: 11,
            incarnation: "aa".into(),
            at: 0,
        });
        let data =
            "1 aa\n2 aa\n3 aa\n4 aa\n5 aa\n6 aa\n7 aa\n8 aa\n9 aa\n10 aa\n11 bb\n11 aa\n12 bb\n";
        let found = acknowledged_lost("w", &w, data);
        assert!(!found.is_empty(), "{found:?}");
    }

    #[test]
    fn records_out_of_order_are_seen() {
        let w = witness(1..=4, "aa");
        let found = acknowledged_lost("w", &w, "1 aa\n3 aa\n2 aa\n4 aa\n");
        assert!(
            found.iter().any(|f| f.contains("out of order")),
            "{found:?}"
        );
    }

    #[test]
    fn a_read_cut_short_is_never_taken_for_the_file() {
        let data = format!("\n{}20\0\0\n", file(&[(1..=1736, "aa")]));
        let whole = format!("{data}\n{FRAME_END} {}\n", data.len());
        assert_eq!(unframed(&whole), Some(data.as_str()));
        // cut anywhere, the count is gone or does not match
        for cut in [
            0,
            1,
            14,
            data.len() / 2,
            data.len(),
            whole.len() - 3,
            whole.len() - 1,
        ] {
            assert_eq!(unframed(&whole[..cut]), None, "cut at {cut}");
        }
        // a count that is not of these bytes: another read's, or a
        // stream that lost a piece in the middle
        let middle_lost = format!("{}{}", &whole[..20], &whole[40..]);
        assert_eq!(unframed(&middle_lost), None);
        // an empty file, read whole, is an empty file
        assert_eq!(unframed(&format!("\n{FRAME_END} 0\n")), Some(""));
    }

    #[test]
    fn the_framed_read_prints_what_unframed_takes() {
        let dir = std::env::temp_dir().join(format!("framed-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("seq");
        let data = format!("\n{}", file(&[(1..=300, "aa")]));
        std::fs::write(&path, &data).expect("write");
        let script = framed_read(&path.display().to_string());
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .expect("sh");
        let _ = std::fs::remove_dir_all(&dir);
        let out = String::from_utf8(out.stdout).expect("utf-8");
        assert_eq!(unframed(&out), Some(data.as_str()), "{script}");
    }

    #[test]
    fn the_witness_reads_whole_lines_only() {
        let w = parse_witness("1 aa 100\n2 aa 101\n3 a");
        assert_eq!(w.len(), 2);
        assert!(alive_since(&w, 100));
        assert!(
            !alive_since(&w, 101),
            "a record of the check's own second may predate it"
        );
    }
}
