import type { Key, ReactNode } from "react";

import type { Resource } from "../lib/useResource";
import { Empty, ErrorBanner, Spinner } from "./common";

export interface ResourceTableProps<T> {
  /** The list, as loaded by `useResource`. */
  items: Resource<T[]>;
  /** Read by screen readers only; the enclosing section's heading is the visible title. */
  caption: string;
  /** Header texts of the data columns, in order. */
  columns: string[];
  /** Shown once the list has loaded and is empty. */
  emptyText: string;
  /** One `<td>` per entry of `columns`. */
  renderCells: (item: T) => ReactNode;
  /** The row's buttons, put in the last cell, under a header only screen readers see. */
  renderActions: (item: T) => ReactNode;
  /** Class of the actions cell; omitted, the cell has none. */
  actionsClassName?: string;
}

/** What tells the rows apart: an item's `id` when it has one (tokens, webhooks); other items (a
 * tenant's members, by user name) must say. */
type RowKey<T> = T extends { id: number } ? { rowKey?: (item: T) => Key } : { rowKey: (item: T) => Key };

/** A loaded list (the user's API tokens and webhooks, a tenant's members) as a table with an actions
 * column, with the list's load error (and a retry), a spinner until the first load, and an empty state. */
export function ResourceTable<T>({
  items,
  caption,
  columns,
  emptyText,
  renderCells,
  renderActions,
  actionsClassName,
  rowKey,
}: ResourceTableProps<T> & RowKey<T>) {
  // RowKey makes rowKey required unless T has a numeric id.
  const keyOf = rowKey ?? ((item: T) => (item as { id: number }).id);
  return (
    <>
      <ErrorBanner error={items.error} onRetry={items.reload} />
      {/* On a reload the old rows stay on screen; the spinner is only for the first load. */}
      {items.loading && !items.data && <Spinner />}
      {items.data?.length === 0 && <Empty>{emptyText}</Empty>}
      {items.data && items.data.length > 0 && (
        <div className="table-wrap">
          <table>
            <caption className="visually-hidden">{caption}</caption>
            <thead>
              <tr>
                {columns.map((column) => (
                  <th key={column} scope="col">
                    {column}
                  </th>
                ))}
                <th scope="col">
                  <span className="visually-hidden">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {items.data.map((item) => (
                <tr key={keyOf(item)}>
                  {renderCells(item)}
                  <td className={actionsClassName}>{renderActions(item)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
