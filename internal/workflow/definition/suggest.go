package definition

// suggest returns the candidate closest to s by edit distance, if it is
// within 2 edits (and fewer edits than s has characters), or "".
func suggest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(s, c, bestD); d < bestD && d < len(s) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance returns the Levenshtein distance between a and b (bytes),
// or max when it is at least max.
func editDistance(a, b string, max int) int {
	if d := len(a) - len(b); d >= max || -d >= max {
		return max
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= max {
			return max
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], max)
}
