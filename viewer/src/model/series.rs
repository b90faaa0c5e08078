//! Counters over a run (allocated, active, reserved bytes after every entry) and the min/max
//! pyramid that lets the timeline draw millions of entries as a few thousand points.

/// Entries per bucket of the finest pyramid level.
const BASE: usize = 8;

/// One counter's value at every cursor position (`values[i]` = after the first `i` entries),
/// with a lazily extended min/max pyramid.
#[derive(Clone, Debug, Default)]
pub struct Series {
    values: Vec<u64>,
    /// `levels[k][j]` = (min, max) of `values[j * (BASE << k) ..][.. BASE << k]`.
    levels: Vec<Vec<(u64, u64)>>,
}

impl Series {
    /// Appends the value after the next entry.
    pub fn push(&mut self, value: u64) {
        self.values.push(value);
    }

    /// Number of cursor positions.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no value was pushed.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value at cursor position `i` (the last one past the end).
    pub fn at(&self, i: usize) -> u64 {
        self.values.get(i).or(self.values.last()).copied().unwrap_or(0)
    }

    /// All values.
    pub fn values(&self) -> &[u64] {
        &self.values
    }

    /// The largest value.
    pub fn max(&mut self) -> u64 {
        self.extend_pyramid();
        match self.levels.last() {
            Some(top) => top.iter().map(|b| b.1).max().unwrap_or(0),
            None => self.values.iter().copied().max().unwrap_or(0),
        }
    }

    /// Every value of `start..end` as a step: the counter holds its value until the next entry.
    fn steps(&self, start: usize, end: usize) -> Vec<[f64; 2]> {
        let mut points = Vec::with_capacity((end - start) * 2);
        for i in start..end {
            let v = self.values[i] as f64;
            if i > start {
                points.push([i as f64, self.values[i - 1] as f64]);
            }
            points.push([i as f64, v]);
        }
        points
    }

    /// Brings the pyramid up to date with the values (only the new tail is recomputed).
    fn extend_pyramid(&mut self) {
        let mut k = 0;
        loop {
            let (source_len, factor) = match k {
                0 => (self.values.len(), BASE),
                _ => (self.levels[k - 1].len(), 2),
            };
            if k > 0 && source_len <= 1 {
                break;
            }
            if self.levels.len() <= k {
                self.levels.push(Vec::new());
            }
            let buckets = source_len.div_ceil(factor);
            let (below, above) = self.levels.split_at_mut(k);
            let level = &mut above[0];
            // The last bucket may have been partial: recompute it with everything after it.
            let from = level.len().saturating_sub(1);
            level.truncate(from);
            for j in from..buckets {
                let (lo, hi) = (j * factor, ((j + 1) * factor).min(source_len));
                let bucket = match below.last() {
                    None => self.values[lo..hi].iter().fold((u64::MAX, 0), |(a, b), &v| (a.min(v), b.max(v))),
                    Some(below) => below[lo..hi].iter().fold((u64::MAX, 0), |(a, b), &(mn, mx)| (a.min(mn), b.max(mx))),
                };
                level.push(bucket);
            }
            k += 1;
        }
    }

    /// How to draw positions `range` (half-open) with at most about `max_points` points: every
    /// value as a step where few enough, else per bucket the lowest and the highest value (a
    /// step function drawn this way looks exactly like the full one at that width).
    pub fn outline(&mut self, range: std::ops::Range<usize>, max_points: usize) -> Outline {
        let start = range.start.min(self.values.len());
        let end = range.end.min(self.values.len());
        if start >= end {
            return Outline::Steps(Vec::new());
        }
        let span = end - start;
        let max_points = max_points.max(16);
        if span * 2 <= max_points {
            return Outline::Steps(self.steps(start, end));
        }
        self.extend_pyramid();
        // Bucket width wanted: two points per bucket.
        let wanted = (span * 2).div_ceil(max_points);
        let mut k = 0;
        let mut width = BASE;
        while width < wanted && k + 1 < self.levels.len() {
            k += 1;
            width *= 2;
        }
        let Some(level) = self.levels.get(k) else {
            return Outline::Steps(self.steps(start, end));
        };
        let first = start / width;
        let last = (end - 1) / width;
        let buckets = last - first + 1;
        let points = buckets * 2;
        let mut band =
            Band { xs: Vec::with_capacity(points), low: Vec::with_capacity(points), high: Vec::with_capacity(points) };
        for (j, &(min, max)) in level.iter().enumerate().take(last + 1).skip(first) {
            // Bucket j holds the values of positions j * width .. (j + 1) * width, each of
            // which lasts one unit of x.
            let from = (j * width).max(start) as f64;
            let to = ((j + 1) * width).min(end) as f64;
            for x in [from, to] {
                band.xs.push(x);
                band.low.push(min as f64);
                band.high.push(max as f64);
            }
        }
        Outline::Band(band)
    }
}

/// A counter as the timeline draws it over some range and width.
#[derive(Clone, Debug, PartialEq)]
pub enum Outline {
    /// Every value, as the corners of a step line.
    Steps(Vec<[f64; 2]>),
    /// Too many values for the width: their range per bucket of about a pixel.
    Band(Band),
}

/// Per bucket, two x positions (where it starts and ends) with the bucket's lowest and highest
/// value at both. Drawn as one filled band it covers each pixel once; the same extremes as a
/// min/max zigzag line overlapped each column three times and were, on a software rasterizer,
/// most of a frame's cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Band {
    /// Increasing x positions, two per bucket.
    pub xs: Vec<f64>,
    /// The bucket's lowest value at each x.
    pub low: Vec<f64>,
    /// The bucket's highest value at each x.
    pub high: Vec<f64>,
}

impl Band {
    /// Widens every bucket narrower than `thickness` (in values) to it, around its middle: a
    /// bucket that held one value is then drawn as thick as a line.
    pub fn thicken(&mut self, thickness: f64) {
        for (low, high) in self.low.iter_mut().zip(self.high.iter_mut()) {
            let missing = thickness - (*high - *low);
            if missing > 0.0 {
                *low -= missing / 2.0;
                *high += missing / 2.0;
            }
        }
    }

    /// Leaves out what `front`, a band over the same x positions drawn after this one, covers:
    /// where this band's bucket starts inside `front`'s, it now starts where `front`'s ends (or
    /// is empty). The picture stays the same, with fewer pixels to shade: a counter that never
    /// goes below another (active above allocated, reserved above active) mostly hides behind it.
    pub fn hide_behind(&mut self, front: &Band) {
        if self.xs != front.xs {
            return;
        }
        for i in 0..self.low.len() {
            let (low, high) = (self.low[i], self.high[i]);
            if front.low[i] <= low && low < front.high[i] {
                self.low[i] = front.high[i].min(high);
            }
        }
    }
}

impl Outline {
    /// The outline with every x multiplied by `scale` (to lay one run over another's axis).
    pub fn scale_x(mut self, scale: f64) -> Self {
        match &mut self {
            Outline::Steps(points) => points.iter_mut().for_each(|p| p[0] *= scale),
            Outline::Band(band) => band.xs.iter_mut().for_each(|x| *x *= scale),
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outline_keeps_extremes() {
        let mut s = Series::default();
        for i in 0..100_000u64 {
            s.push(if i == 54_321 { 1_000_000 } else { i % 1000 });
        }
        let Outline::Band(band) = s.outline(0..100_000, 500) else { panic!("100,000 values in 500 points are a band") };
        assert!(band.xs.len() <= 1100, "{}", band.xs.len());
        assert!(band.xs.windows(2).all(|w| w[0] <= w[1]), "x increases");
        assert_eq!((band.xs[0], *band.xs.last().unwrap()), (0.0, 100_000.0), "the band spans the range");
        assert!(band.high.contains(&1_000_000.0), "the spike survives");
        assert!(band.low.iter().zip(&band.high).all(|(lo, hi)| lo <= hi));
        assert_eq!(s.max(), 1_000_000);
        // Appending more recomputes the tail.
        s.push(2_000_000);
        assert_eq!(s.max(), 2_000_000);
        let Outline::Steps(few) = s.outline(10..20, 500) else { panic!("10 values are steps") };
        assert_eq!(few.len(), 19, "steps: two points per value after the first");
        assert_eq!(few[..3], [[10.0, 10.0], [11.0, 10.0], [11.0, 11.0]]);
        assert_eq!(Outline::Steps(few[..1].to_vec()).scale_x(2.0), Outline::Steps(vec![[20.0, 10.0]]));
    }

    #[test]
    fn bands_thicken_and_hide_only_what_is_covered() {
        let band =
            |low: &[f64], high: &[f64]| Band { xs: vec![0.0, 1.0, 2.0, 3.0], low: low.to_vec(), high: high.to_vec() };
        let mut flat = band(&[5.0; 4], &[5.0, 5.0, 5.0, 9.0]);
        flat.thicken(2.0);
        assert_eq!((flat.low.clone(), flat.high.clone()), (vec![4.0, 4.0, 4.0, 5.0], vec![6.0, 6.0, 6.0, 9.0]));
        let front = band(&[0.0, 0.0, 0.0, 0.0], &[4.0, 4.0, 4.0, 4.0]);
        // Starts inside the front band: begins where it ends; wholly inside: empty; starts
        // below it: both parts show, unchanged; starts above it: unchanged.
        let mut back = band(&[1.0, 2.0, -1.0, 5.0], &[8.0, 3.0, 8.0, 9.0]);
        back.hide_behind(&front);
        assert_eq!(back.low, vec![4.0, 3.0, -1.0, 5.0]);
        assert_eq!(back.high, vec![8.0, 3.0, 8.0, 9.0]);
        // Other x positions: nothing to compare with.
        let mut other = Band { xs: vec![0.0, 2.0, 4.0, 6.0], ..back.clone() };
        other.hide_behind(&front);
        assert_eq!(other.low, back.low);
    }
}
