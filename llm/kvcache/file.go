package kvcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// The file format (little endian), written once and never changed in place:
//
//	magic     [8]byte "PRLYKV01"
//	identity  u32 length + bytes   (Config.Identity: model, llama.cpp build, KV layout)
//	key       u32 length + bytes   (the session)
//	tokens    u32 count + count × i32
//	state     u64 length + bytes   (llama_state_seq_get_data's output)
//	checksum  u32                  CRC-32C of every byte before it
//
// The header (everything before the state) is read alone when the
// directory is scanned at start; the whole file, checksum included, is
// read and checked before its state is handed to llama.cpp.
var magic = [8]byte{'P', 'R', 'L', 'Y', 'K', 'V', '0', '1'}

// Bounds a header must respect before anything is allocated for it.
const (
	maxIdentity = 4 << 10
	maxKey      = 4 << 10
	maxTokens   = 1 << 21 // past any context length
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of a file that cannot be used: each is a fallback to recompute.
var (
	ErrCorrupt = errors.New("kvcache: corrupt file")          // bad magic, a field out of bounds, truncation or a checksum mismatch
	ErrForeign = errors.New("kvcache: file of another model") // another identity: another model, llama.cpp build or KV layout
)

// header is a file's metadata.
type header struct {
	identity string
	key      string
	tokens   []int
	stateLen uint64
}

// encodeHeader returns the header's bytes, up to the state.
func encodeHeader(h header) []byte {
	var b bytes.Buffer
	b.Write(magic[:])
	putBytes := func(s string) {
		_ = binary.Write(&b, binary.LittleEndian, uint32(len(s)))
		b.WriteString(s)
	}
	putBytes(h.identity)
	putBytes(h.key)
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(h.tokens)))
	for _, t := range h.tokens {
		_ = binary.Write(&b, binary.LittleEndian, int32(t))
	}
	_ = binary.Write(&b, binary.LittleEndian, h.stateLen)
	return b.Bytes()
}

// readHeader reads a header from r, checking every length before it
// allocates, and returns it with its size in bytes.
func readHeader(r io.Reader) (header, int64, error) {
	var h header
	var n int64
	read := func(v any) error {
		if err := binary.Read(r, binary.LittleEndian, v); err != nil {
			return ErrCorrupt
		}
		n += int64(binary.Size(v))
		return nil
	}
	readString := func(limit uint32) (string, error) {
		var l uint32
		if err := read(&l); err != nil {
			return "", err
		}
		if l > limit {
			return "", ErrCorrupt
		}
		buf := make([]byte, l)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", ErrCorrupt
		}
		n += int64(l)
		return string(buf), nil
	}
	var m [8]byte
	if err := read(&m); err != nil || m != magic {
		return h, n, ErrCorrupt
	}
	var err error
	if h.identity, err = readString(maxIdentity); err != nil {
		return h, n, err
	}
	if h.key, err = readString(maxKey); err != nil {
		return h, n, err
	}
	var count uint32
	if err := read(&count); err != nil {
		return h, n, err
	}
	if count > maxTokens {
		return h, n, ErrCorrupt
	}
	raw := make([]int32, count)
	if err := read(raw); err != nil {
		return h, n, err
	}
	h.tokens = make([]int, count)
	for i, t := range raw {
		h.tokens[i] = int(t)
	}
	if err := read(&h.stateLen); err != nil {
		return h, n, err
	}
	return h, n, nil
}

// writeFile writes an entry to dir/name atomically: a temporary file in
// dir, synced, then renamed over name, so a reader (or a restart after a
// crash) sees either the whole file or none.
func writeFile(dir, name string, h header, state []byte) (int64, error) {
	h.stateLen = uint64(len(state))
	head := encodeHeader(h)
	sum := crc32.Update(crc32.Checksum(head, castagnoli), castagnoli, state)
	f, err := os.CreateTemp(dir, "tmp-*.part")
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], sum)
	for _, b := range [][]byte{head, state, tail[:]} {
		if _, err := f.Write(b); err != nil {
			return 0, fmt.Errorf("write: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("close: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return 0, fmt.Errorf("rename: %w", err)
	}
	ok = true
	return int64(len(head) + len(state) + len(tail)), nil
}

// readFile reads and checks a whole file: its identity must be identity and
// its checksum must hold.
func readFile(path, identity string) (header, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return header{}, nil, err
	}
	if len(data) < 4 {
		return header{}, nil, ErrCorrupt
	}
	body, tail := data[:len(data)-4], data[len(data)-4:]
	h, n, err := readHeader(bytes.NewReader(body))
	if err != nil {
		return h, nil, err
	}
	if h.identity != identity {
		return h, nil, ErrForeign
	}
	if uint64(len(body))-uint64(n) != h.stateLen || crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(tail) {
		return h, nil, ErrCorrupt
	}
	return h, body[n:], nil
}

// readFileHeader reads only the header of a file, and its size.
func readFileHeader(path string) (header, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return header{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return header{}, 0, err
	}
	h, n, err := readHeader(io.LimitReader(f, st.Size()))
	if err != nil {
		return h, 0, err
	}
	if uint64(st.Size()) != uint64(n)+h.stateLen+4 {
		return h, 0, ErrCorrupt // truncated (or grown)
	}
	return h, st.Size(), nil
}

// Encode returns e as the bytes of a file (the format above) for identity:
// what a Tier stores, so every tier checks the same identity, key, tokens
// and checksum before a state is used.
func Encode(identity string, e *Entry) []byte {
	head := encodeHeader(header{identity: identity, key: e.Key, tokens: e.Tokens, stateLen: uint64(len(e.State))})
	out := make([]byte, 0, len(head)+len(e.State)+4)
	out = append(append(out, head...), e.State...)
	return binary.LittleEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

// EncodeHeader returns the header of e's encoding (Encode) alone: the
// identity, the key and the tokens, what Tokens reads without the state.
func EncodeHeader(identity string, e *Entry) []byte {
	return encodeHeader(header{identity: identity, key: e.Key, tokens: e.Tokens, stateLen: uint64(len(e.State))})
}

// Decode checks data (Encode's bytes) and returns its entry: ErrCorrupt when
// it is truncated, out of bounds or fails its checksum, ErrForeign when it
// was written for another identity or another key (a state of another
// model, llama.cpp build, KV layout or user is never returned).
func Decode(data []byte, identity, key string) (*Entry, error) {
	if len(data) < 4 {
		return nil, ErrCorrupt
	}
	body, tail := data[:len(data)-4], data[len(data)-4:]
	h, n, err := readHeader(bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if h.identity != identity || h.key != key {
		return nil, ErrForeign
	}
	if uint64(len(body))-uint64(n) != h.stateLen || crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(tail) {
		return nil, ErrCorrupt
	}
	return &Entry{Key: key, Tokens: h.tokens, State: body[n:]}, nil
}

// DecodeTokens checks a header (EncodeHeader's bytes, or the start of
// Encode's) and returns its tokens, with the errors of Decode.
func DecodeTokens(head []byte, identity, key string) ([]int, error) {
	h, _, err := readHeader(bytes.NewReader(head))
	if err != nil {
		return nil, err
	}
	if h.identity != identity || h.key != key {
		return nil, ErrForeign
	}
	return h.tokens, nil
}
