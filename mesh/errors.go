package mesh

import "errors"

var (
	// ErrClosed is returned by calls made after [Mesh.Close].
	ErrClosed = errors.New("mesh: closed")

	// ErrInvalidConfig is wrapped by [Config.Validate] errors; the message
	// names the offending field.
	ErrInvalidConfig = errors.New("mesh: invalid config")

	// ErrMetaTooLarge is returned by [EncodeMeta] and [DecodeMeta] when the
	// encoded metadata, or one of its strings, exceeds its limit
	// ([MaxMetaSize], [MaxMetaStringLen]). Shorten the addresses or ids.
	ErrMetaTooLarge = errors.New("mesh: metadata too large")

	// ErrBadMeta is returned by [DecodeMeta] for input that is not metadata
	// this version understands (wrong version byte, malformed msgpack,
	// trailing bytes).
	ErrBadMeta = errors.New("mesh: malformed metadata")

	// ErrIncompatible is wrapped by the error that refuses a peer whose
	// feature levels ([Meta.MinLevel] to [Meta.MaxLevel]) have none in
	// common with this peer's, or do not include the cluster's level (see
	// [Mesh.SetLevel]). The message names the peer and both ranges;
	// upgrade the older peer.
	ErrIncompatible = errors.New("mesh: incompatible protocol version")

	// ErrUnknownTarget is returned by [Registry.Resolve] when the replica is
	// not registered, or when no live member gossips the replica's
	// NodeHostID. dragonboat drops the message and retries later.
	ErrUnknownTarget = errors.New("mesh: unknown raft target")
)
