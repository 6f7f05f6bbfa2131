import type { ReactNode } from "react";

import type { Resource } from "../lib/useResource";
import { Empty, ErrorBanner, Spinner } from "./common";

export interface ResourceTableProps<T extends { id: number }> {
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

/** A loaded list of the user's own things (API tokens, webhooks) as a table with an actions column,
 * with the list's load error (and a retry), a spinner until the first load, and an empty state. */
export function ResourceTable<T extends { id: number }>({
  items,
  caption,
  columns,
  emptyText,
  renderCells,
  renderActions,
  actionsClassName,
}: ResourceTableProps<T>) {
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
                <tr key={item.id}>
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
