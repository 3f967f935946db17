package timeshard

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	pb "github.com/timeshard/timeshard/clients/go/gen/timeshard/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What a handler returns is stored as the Python worker stores it: nil no result, []byte as
// it is, anything else as compact JSON with <, > and & kept.
func TestEncodeResult(t *testing.T) {
	for _, c := range []struct {
		name     string
		value    any
		data     string
		encoding string
	}{
		{"nil", nil, "", ""},
		{"bytes", []byte{0, 1, 0xff}, "\x00\x01\xff", ResultBytes},
		{"empty bytes", []byte{}, "", ResultBytes},
		{"a map", map[string]any{"b": "<a&b>", "a": []int{1, 2}}, `{"a":[1,2],"b":"<a&b>"}`, ResultJSON},
		{"a struct", struct {
			Sum  int    `json:"sum"`
			Note string `json:"note,omitempty"`
		}{Sum: 3}, `{"sum":3}`, ResultJSON},
		{"a string", "héllo", `"héllo"`, ResultJSON},
		{"a typed nil is JSON null", (*int)(nil), `null`, ResultJSON},
		{"raw JSON, compacted", json.RawMessage("{ \"a\" : 1 }"), `{"a":1}`, ResultJSON},
	} {
		data, encoding, err := encodeResult(c.value)
		if err != nil || string(data) != c.data || encoding != c.encoding {
			t.Errorf("%s: got %q %q %v, want %q %q", c.name, data, encoding, err, c.data, c.encoding)
		}
	}
}

type panicsInJSON struct{}

func (panicsInJSON) MarshalJSON() ([]byte, error) { panic("no JSON for me") }

// A value that can not be stored is a *resultError saying why and what to do instead.
func TestEncodeResultRefusesWhatCanNotBeStored(t *testing.T) {
	for _, c := range []struct {
		name  string
		value any
		want  []string
	}{
		{"a channel", make(chan int), []string{"ResultError: ", "a chan int that is not JSON-serialisable", "return JSON-serialisable data, []byte or nil"}},
		{"NaN", math.NaN(), []string{"float64 that is not JSON-serialisable", "NaN"}},
		{"invalid raw JSON", json.RawMessage("{"), []string{"json.RawMessage that is not JSON-serialisable"}},
		{"a panicking MarshalJSON", panicsInJSON{}, []string{"not JSON-serialisable", "panicked: no JSON for me"}},
		{"bytes over the limit", make([]byte, MaxResultBytes+1), []string{
			"the handler's result is 262145 bytes, over the limit of 262144 bytes; keep large output elsewhere and return a reference to it"}},
		{"JSON over the limit", strings.Repeat("x", MaxResultBytes), []string{"262146 bytes, over the limit of 262144 bytes"}},
	} {
		data, encoding, err := encodeResult(c.value)
		var re *resultError
		if !errors.As(err, &re) || data != nil || encoding != "" {
			t.Errorf("%s: got %d bytes %q, error %v; want a resultError", c.name, len(data), encoding, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", c.name, err, w)
			}
		}
	}
	if data, _, err := encodeResult(make([]byte, MaxResultBytes)); err != nil || len(data) != MaxResultBytes {
		t.Fatalf("a result of exactly the limit: %d bytes, %v", len(data), err)
	}
}

// stackError prints a stack with %+v, as errors from github.com/pkg/errors and the like do.
type stackError struct{ msg string }

func (e stackError) Error() string { return e.msg }
func (e stackError) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('+') {
		fmt.Fprintf(f, "%s\nmain.step\n\t/src/main.go:12", e.msg)
		return
	}
	fmt.Fprint(f, e.msg)
}

// A returned error's traceback is its %+v when that says more than its text, else nothing.
func TestTracebackOfAReturnedError(t *testing.T) {
	withStack := stackError{"db down"}
	want := "db down\nmain.step\n\t/src/main.go:12"
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"a plain error", errors.New("plain"), ""},
		{"a wrapped plain error", fmt.Errorf("step: %w", errors.New("plain")), ""},
		{"an error with a stack", withStack, want},
		{"a permanent error with a stack", Permanent(withStack), want},
	} {
		if got := tracebackOf(c.err); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// A long traceback keeps its end, cut at a character boundary, and says it was cut.
func TestTruncateTracebackKeepsTheEnd(t *testing.T) {
	short := "panic: x\n\ngoroutine 1 [running]:"
	if truncateTraceback(short) != short {
		t.Fatal("a short traceback was changed")
	}
	long := strings.Repeat("é", 6000) + "\nthe end: where it failed"
	got := truncateTraceback(long)
	if len(got) > maxTracebackBytes || !utf8.ValidString(got) {
		t.Fatalf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if !strings.HasPrefix(got, fmt.Sprintf("(truncated from %d bytes) ...\n", len(long))) ||
		!strings.HasSuffix(got, "\nthe end: where it failed") {
		t.Fatalf("got %q...%q", got[:40], got[len(got)-40:])
	}
}

// DecodeResult reads a JSON result, and says clearly why when there is none to read.
func TestDecodeResult(t *testing.T) {
	var got struct{ Sum int }
	job := &pb.Job{JobId: "j1", State: pb.JobState_JOB_STATE_SUCCEEDED, Result: []byte(`{"Sum":4}`), ResultEncoding: ResultJSON}
	if err := DecodeResult(job, &got); err != nil || got.Sum != 4 {
		t.Fatalf("json: %+v %v", got, err)
	}
	bytesJob := &pb.Job{JobId: "j2", Result: []byte{1, 2}, ResultEncoding: ResultBytes}
	if err := DecodeResult(bytesJob, &got); err == nil || errors.Is(err, ErrNoResult) ||
		!strings.Contains(err.Error(), "its result is bytes, not JSON (2 bytes): read job.GetResult()") {
		t.Fatalf("bytes: %v", err)
	}
	dead := &pb.Job{JobId: "j3", State: pb.JobState_JOB_STATE_DEAD}
	if err := DecodeResult(dead, &got); !errors.Is(err, ErrNoResult) || !strings.Contains(err.Error(), "job j3 is dead") {
		t.Fatalf("no result: %v", err)
	}
	odd := &pb.Job{JobId: "j4", Result: []byte("x"), ResultEncoding: "xml"}
	if err := DecodeResult(odd, &got); err == nil || !strings.Contains(err.Error(), `unknown result encoding "xml"`) {
		t.Fatalf("unknown encoding: %v", err)
	}
	broken := &pb.Job{JobId: "j5", Result: []byte("{"), ResultEncoding: ResultJSON}
	var syntax *json.SyntaxError
	if err := DecodeResult(broken, &got); !errors.As(err, &syntax) {
		t.Fatalf("bad JSON: %v", err)
	}
}

// A wait's timeout is a DeadlineExceeded naming the jobs not finished (the first five).
func TestWaitTimeoutErrorNamesThePending(t *testing.T) {
	err := error(&WaitTimeoutError{Pending: []string{"a", "b", "c", "d", "e", "f"}, Timeout: 1500 * time.Millisecond})
	if !errors.Is(err, ErrDeadlineExceeded) || errors.Is(err, ErrNotFound) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("%v is not a deadline exceeded", err)
	}
	want := `timeshard: 6 job(s) not finished within 1.5s: "a", "b", "c", "d", "e" ...; wait again`
	if !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%q\nwant %q...", err, want)
	}
}
