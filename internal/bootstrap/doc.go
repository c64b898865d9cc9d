// Package bootstrap holds the rules by which peers form a cluster, as pure
// code: who coordinates and when ([Decide], [MayFound]), the first layout
// ([NewPlan], at the newest feature level every founder speaks:
// [NewLevel], [Speaks]), and a founder's promises during the two-phase
// agreement on it ([Promises]). internal/membership runs them; the
// controller raises the level by the same [NewLevel] rule.
package bootstrap
