package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice"
)

// optKeyWeights is the flag --key-weight of `queues set`: KEY=WEIGHT,
// repeated, merged by the server into the queue's weights; or none alone,
// every key back to weight 1.
type optKeyWeights struct {
	set, clear bool
	w          sluice.KeyWeights
}

func (o *optKeyWeights) String() string {
	if !o.set {
		return ""
	}
	if o.clear {
		return "none"
	}
	return queueWeightsOf(o.w)
}

func (o *optKeyWeights) Set(s string) error {
	if s == "none" {
		if len(o.w) > 0 {
			return fmt.Errorf("none sets every key back to weight 1: give it alone, not with KEY=WEIGHT")
		}
		o.set, o.clear = true, true
		return nil
	}
	if o.clear {
		return fmt.Errorf("none sets every key back to weight 1: give it alone, not with KEY=WEIGHT")
	}
	key, w, err := sluice.ParseKeyWeight(s)
	if err != nil {
		return err
	}
	if o.w == nil {
		o.w = sluice.KeyWeights{}
	}
	o.set, o.w[key] = true, w
	return nil
}

func (o *optKeyWeights) Type() string { return "KEY=WEIGHT|none" }

// param is the update the flag asks for.
func (o *optKeyWeights) param() sluice.Opt[sluice.KeyWeights] {
	if o.clear {
		return sluice.Null[sluice.KeyWeights]()
	}
	return sluice.Set(o.w)
}

// queueWeights shows a queue's key weights: "none", or "KEY=W, …" in key
// order.
func queueWeights(q *sluice.Queue) string { return queueWeightsOf(q.KeyWeights) }

func queueWeightsOf(w sluice.KeyWeights) string {
	if len(w) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Itoa(w[k])
	}
	return strings.Join(parts, ", ")
}
