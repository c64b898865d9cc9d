package level_test

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// The formats a level gives are the constants of the packages that define
// them: level imports none of them, so this pins the numbers.
func TestFormatsAreTheirPackagesConstants(t *testing.T) {
	for _, tc := range []struct {
		l                 level.Level
		command, snapshot byte
		scheme            uint8
	}{
		{level.Positional, lockfsm.FormatPositional, 2, layout.KeySchemeWhole},
		{level.Tagged, lockfsm.FormatTagged, 2, layout.KeySchemeHashTag},
		{level.Family, lockfsm.FormatTagged, 3, layout.KeySchemeHashTag},
		{level.Coordination, lockfsm.FormatTagged, lockfsm.SnapshotVersion, layout.KeySchemeHashTag},
	} {
		if got := tc.l.CommandFormat(); got != tc.command {
			t.Errorf("level %d: command format %d, want %d", tc.l, got, tc.command)
		}
		if got := tc.l.LockSnapshotFormat(); got != tc.snapshot {
			t.Errorf("level %d: lock snapshot format %d, want %d", tc.l, got, tc.snapshot)
		}
		if got := layout.KeySchemeFor(tc.l); got != tc.scheme {
			t.Errorf("level %d: key scheme %d, want %d", tc.l, got, tc.scheme)
		}
	}
	// A command's FeatureLevel names a level, and the newest it names is
	// the newest level.
	if got := (&lockfsm.Command{Op: lockfsm.OpSetValue}).FeatureLevel(); level.Level(got) != level.Coordination || level.Max != level.Coordination {
		t.Errorf("SetValue needs level %d, the newest level is %d, want both %d", got, level.Max, level.Coordination)
	}
	if level.Max.CommandFormat() != lockfsm.Version {
		t.Errorf("the newest level writes command format %d, lockfsm's newest is %d", level.Max.CommandFormat(), lockfsm.Version)
	}
}

// Every predicate of a level holds from the level that brought it on, and
// only from there: a cluster never loses what it had as its level rises.
func TestPredicatesHoldFromTheirLevelOn(t *testing.T) {
	preds := map[string]struct {
		f    func(level.Level) bool
		from level.Level
	}{
		"HashesTags":      {level.Level.HashesTags, level.Tagged},
		"LabelsSessions":  {level.Level.LabelsSessions, level.Family},
		"HasLockFamily":   {level.Level.HasLockFamily, level.Family},
		"CarriesTraces":   {level.Level.CarriesTraces, level.Family},
		"CapsSessions":    {level.Level.CapsSessions, level.Family},
		"ReportsApplied":  {level.Level.ReportsApplied, level.Family},
		"HasCoordination": {level.Level.HasCoordination, level.Coordination},
	}
	for name, p := range preds {
		for l := level.Min; l <= level.Max+1; l++ {
			if got, want := p.f(l), l >= p.from; got != want {
				t.Errorf("level %d: %s = %v, want %v", l, name, got, want)
			}
		}
	}
}

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		recorded uint32
		want     level.Level
	}{{0, 1}, {1, 1}, {2, 2}, {3, 3}, {255, 255}, {256, 255}, {1 << 31, 255}} {
		if got := level.Of(tc.recorded); got != tc.want {
			t.Errorf("Of(%d) = %d, want %d", tc.recorded, got, tc.want)
		}
	}
}

// Requests and statuses carry a Level where they carried a uint8: its
// encoding must be the uint8's, byte for byte, or older peers misread it.
func TestEncodesAsAUint8(t *testing.T) {
	for l := range 256 {
		got, err := msgpack.Marshal(struct {
			L level.Level `msgpack:"v,omitempty"`
		}{level.Level(l)})
		if err != nil {
			t.Fatal(err)
		}
		want, err := msgpack.Marshal(struct {
			L uint8 `msgpack:"v,omitempty"`
		}{uint8(l)})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("level %d encodes as % x, a uint8 as % x", l, got, want)
		}
	}
}
